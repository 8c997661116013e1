"""Each alert rule fires on crafted metrics, stays quiet on healthy ones, and fires once per episode."""
import math

import pytest

from hindsight.lookback.alerts import RULES, AlertMonitor, window_mean
from hindsight.config import AlertRule, ConfigError, RLConfig, load_config

HEALTHY = {"policy/entropy": 1.2, "reward/std": 0.3, "policy/kl": 0.02, "policy/loss": 0.1, "policy/grad_norm": 0.5,
           "response_length/mean": 10.0, "reward/mean": 0.5}


def feed(rule: AlertRule, steps: list[dict]):
    """Observe each step's metrics (HEALTHY overridden); returns alerts per step."""
    monitor = AlertMonitor([rule])
    return [monitor.observe(i + 1, {**HEALTHY, **m}) for i, m in enumerate(steps)]


@pytest.mark.parametrize("rule,bad,threshold,window", [
    ("entropy_low", {"policy/entropy": 0.01}, 0.05, 2),
    ("reward_std_low", {"reward/std": 0.0}, 1e-3, 2),
    ("kl_high", {"policy/kl": 1.5}, 1.0, 2),
    ("length_collapse", {"response_length/mean": 2.0}, 0.25, 2),
    ("length_explode", {"response_length/mean": 50.0}, 4.0, 2),
])
def test_window_rules_fire_only_once_the_window_mean_crosses(rule, bad, threshold, window):
    r = AlertRule(rule=rule, threshold=threshold, window=window)
    # healthy, then one bad step (window mean not across yet), then a second bad step
    fired = feed(r, [{}, {}, bad, bad, bad])
    assert [len(f) for f in fired] == [0, 0, 0, 1, 0]  # edge-triggered: once while it holds
    alert = fired[3][0]
    assert alert.rule == rule and alert.step == 4 and alert.action == "warn"
    key = next(iter(bad))
    expected = bad[key] if key != "response_length/mean" else bad[key] / HEALTHY[key]
    assert alert.value == pytest.approx(expected)
    assert rule in alert.message and "step 4" in alert.message


def test_window_rule_fires_again_after_clearing():
    r = AlertRule(rule="kl_high", threshold=1.0)
    fired = feed(r, [{"policy/kl": 2.0}, {"policy/kl": 2.0}, {}, {"policy/kl": 5.0}])
    assert [len(f) for f in fired] == [1, 0, 0, 1]


@pytest.mark.parametrize("bad", [{"policy/loss": math.nan}, {"policy/loss": math.inf}, {"policy/grad_norm": -math.inf}])
def test_nonfinite_loss_fires_on_nan_or_inf(bad):
    fired = feed(AlertRule(rule="nonfinite_loss", action="stop"), [{}, bad])
    assert fired[0] == [] and len(fired[1]) == 1
    assert fired[1][0].action == "stop" and not math.isfinite(fired[1][0].value)


def test_nonfinite_loss_reads_the_string_form_kept_in_metrics_jsonl():
    fired = feed(AlertRule(rule="nonfinite_loss"), [{"policy/loss": "nan"}])
    assert len(fired[0]) == 1


def test_reward_hacking_fires_when_reward_rises_while_accuracy_falls():
    r = AlertRule(rule="reward_hacking", threshold=0.05)
    monitor = AlertMonitor([r])
    assert monitor.observe(0, {"eval/accuracy": 0.60}) == []
    for step, reward in [(1, 0.2), (2, 0.3)]:
        assert monitor.observe(step, {"reward/mean": reward}) == []
    # eval at step 2 fell 0.60 -> 0.40 while reward rose 0.2 (first step) -> 0.25 (mean of steps 1-2)
    fired = monitor.observe(2, {"eval/accuracy": 0.40})
    assert len(fired) == 1 and fired[0].value == pytest.approx(0.20)


@pytest.mark.parametrize("rewards,accs", [
    ([0.2, 0.3], [0.60, 0.58]),   # accuracy fell by less than the threshold
    ([0.3, 0.2], [0.60, 0.40]),   # accuracy fell, but so did the reward: not hacking, just worse
    ([0.2, 0.3], [0.40, 0.60]),   # both rose: learning
])
def test_reward_hacking_quiet_otherwise(rewards, accs):
    monitor = AlertMonitor([AlertRule(rule="reward_hacking", threshold=0.05)])
    monitor.observe(0, {"eval/accuracy": accs[0]})
    for step, reward in enumerate(rewards, 1):
        monitor.observe(step, {"reward/mean": reward})
    assert monitor.observe(len(rewards), {"eval/accuracy": accs[1]}) == []


def test_window_mean_needs_a_full_window():
    history = [{"step": 1, "kl": 1.0}, {"step": 2}, {"step": 3, "kl": 3.0}]
    assert window_mean(history, "kl", 2) == 2.0
    assert window_mean(history, "kl", 3) is None


def test_every_configurable_rule_is_implemented_and_documented():
    from typing import get_args
    from pathlib import Path

    names = set(get_args(AlertRule.model_fields["rule"].annotation))
    assert names == set(RULES)
    doc = (Path(__file__).resolve().parents[3] / "docs/metrics.md").read_text()
    assert all(f"| `{n}` |" in doc for n in names)
    assert {r.rule for r in RLConfig().alerts} == names  # each rule is on by default


def test_unknown_rule_or_action_is_a_config_error_naming_the_field(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("rl:\n  alerts:\n    - {rule: kl_high, threshold: 1, action: explode}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3: rl.alerts.0.action"):
        load_config(bad)
    bad.write_text("rl:\n  alerts:\n    - {rule: kl_hgih}\n")
    with pytest.raises(ConfigError, match=r"rl.alerts.0.rule"):
        load_config(bad)
