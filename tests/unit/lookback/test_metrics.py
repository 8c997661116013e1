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
    from hindsight.lookback.metrics import watch_order

    names = ["time/update_s", "learn/packing", "kl", "memory/cpu_peak_mb", "reward/std", "entropy", "eval/accuracy",
             "reward/mean", "clip_fraction", "response_length/mean", "loss", "eval/accuracy_before", "grad_norm", "lr"]
    assert sorted(names, key=watch_order) == [
        "reward/mean", "eval/accuracy", "reward/std", "eval/accuracy_before", "kl", "entropy", "response_length/mean",
        "clip_fraction", "loss", "grad_norm", "learn/packing", "lr", "memory/cpu_peak_mb", "time/update_s"]
