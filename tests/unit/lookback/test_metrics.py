"""Rollout metrics against hand-computed values and numpy; the metric log survives a torn write."""
import numpy as np
import pytest

from hindsight.lookback.history import MetricsLog
from hindsight.lookback.metrics import percentile, rollout_metrics, zero_variance_fraction


def test_percentile_matches_numpy():
    xs = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]
    for q in (0, 50, 95, 100):
        assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))


def test_rollout_metrics_by_hand():
    # two groups of two; max_new_tokens 4: row 1 hit the cap without EOS (truncated)
    rows = [{"completion_ids": [1, 2], "ended_with_eos": True}, {"completion_ids": [1, 2, 3, 4], "ended_with_eos": False},
            {"completion_ids": [5], "ended_with_eos": True}, {"completion_ids": [5, 6, 7], "ended_with_eos": True}]
    scores = [{"reward": 1.0, "reward_exact": 1.0, "rm_score": 0.5}, {"reward": 0.0, "reward_exact": 0.0, "rm_score": -0.5},
              {"reward": 1.0, "reward_exact": 1.0, "rm_score": 1.0}, {"reward": 1.0, "reward_exact": 1.0, "rm_score": 0.0}]
    m = rollout_metrics(rows, scores, group_size=2, max_new_tokens=4)
    assert m["reward/mean"] == 0.75 and m["reward/min"] == 0.0 and m["reward/max"] == 1.0
    assert m["reward/std"] == pytest.approx(np.std([1, 0, 1, 1], ddof=1))
    assert m["reward/zero_std_fraction"] == 0.5          # group 2 is (1, 1)
    assert m["response_length/mean"] == 2.5
    assert m["response_length/p95"] == pytest.approx(np.percentile([2, 4, 1, 3], 95))
    assert m["response_length/truncated_fraction"] == 0.25
    assert m["rollout/completion_rate"] == 0.75
    assert m["reward/exact"] == 0.75 and m["reward/rm_score"] == 0.25


def test_zero_variance_fraction():
    assert zero_variance_fraction([1, 1, 0, 1, 2, 2], 2) == pytest.approx(2 / 3)


def test_metrics_log_merges_steps_skips_a_torn_line_and_truncates(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.append(0, {"eval/accuracy": 0.5})
    log.append(1, {"kl": 0.1, "loss": float("nan")})
    log.append(2, {"kl": 0.2})
    log.append(1, {"kl": 0.15})            # a resumed run redoing step 1: the newest wins
    with open(log.path, "a") as fh:
        fh.write('{"step": 3, "kl"')        # SIGKILL mid-line
    rows = log.read()
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[1]["kl"] == 0.15 and rows[1]["loss"] == "nan"
    log.truncate_after(1)
    assert [r["step"] for r in log.read()] == [0, 1]


def test_the_reward_band_stays_within_the_observed_rewards():
    from hindsight.lookback.plots import reward_band, reward_curve

    history = [{"step": 1, "reward/mean": 0.1, "reward/std": 0.3, "reward/min": 0.0, "reward/max": 1.0},
               {"step": 2, "reward/mean": 0.9, "reward/std": 0.3, "reward/min": 0.0, "reward/max": 1.0},
               {"step": 3, "eval/accuracy": 0.5}]
    steps, mean, lower, upper = reward_band(history)
    assert steps == [1, 2] and mean == [0.1, 0.9]
    assert lower == pytest.approx([0.0, 0.6]) and upper == pytest.approx([0.4, 1.0])  # 0.1 - 0.3, 0.9 + 0.3: clipped
    assert reward_curve(history)[:4] == b"\x89PNG"


def test_the_metrics_one_watches_come_first_and_bookkeeping_after():
    from hindsight.lookback.metrics import recorded, watch_order

    produced = {"time/update_s": 1, "learn/packing": 1, "kl": 1, "memory/cpu_peak_mb": 1, "reward/std": 1,
                "entropy": 1, "eval/accuracy": 1, "reward/mean": 1, "clip_fraction": 1, "response_length/mean": 1,
                "loss": 1, "eval/accuracy_before": 1, "grad_norm": 1, "lr": 1, "ratio_mean/iter0": 1,
                "rollout/tokens_per_s": 1, "rollout/completion_rate": 1, "offpolicy/ratio_p50": 1}
    names = list(recorded(produced))
    assert sorted(names, key=watch_order) == [
        "reward/mean", "eval/accuracy", "reward/std", "eval/accuracy_before", "policy/kl", "policy/entropy",
        "response_length/mean", "policy/clip_fraction", "policy/grad_norm", "policy/loss", "policy/ratio_mean/iter0",
        "rollout/completion_rate", "offpolicy/ratio_p50", "runtime/learn/packing", "runtime/lr",
        "runtime/memory/cpu_peak_mb", "runtime/rollout/tokens_per_s", "runtime/time/update_s"]


def test_every_watched_section_sorts_before_the_bookkeeping_as_mlflow_lays_them_out():
    """MLflow sorts a run page's sections by code point: each watched section must come before runtime/."""
    from hindsight.lookback.metrics import recorded_name

    produced = ["kl", "entropy", "loss", "reward/mean", "reward/curve/asymptote", "eval/accuracy", "critic/loss",
                "response_length/p95", "rollout/completion_rate", "offpolicy/mismatch_kl_k3", "multiturn/turns",
                "negative_ft/loss", "learn/micro_batches", "time/rollout_s", "memory/cpu_peak_mb", "store/regenerated_shards",
                "lr", "lr/alert_multiplier", "dynamic_sampling/kept_groups", "replay/count", "publish/bytes",
                "async/staleness", "workers/rollout", "config/lr"]
    sections = {recorded_name(n).rpartition("/")[0] for n in produced}
    watched = {s for s in sections if not s.startswith("runtime")}
    assert "" not in sections  # nothing lands in MLflow's unprefixed section, which comes last
    assert max(watched) < min(s for s in sections if s.startswith("runtime"))
