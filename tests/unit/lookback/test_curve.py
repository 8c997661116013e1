"""The fitted learning curve (ScaleRL's sigmoid) and the sweep's early-stop rule."""
import json

import numpy as np
import pytest

from hindsight.lookback.curve import fit_curve, run_curves, sigmoid
from hindsight.lookback.early_stop import leader, post, verdict

X = np.arange(1, 41) * 32.0  # 40 steps of 32 samples


def test_the_fit_recovers_a_known_curve_and_its_interval_holds_it():
    y = sigmoid(X, 0.1, 0.6, 300.0, 1.5) + np.random.default_rng(2).normal(0, 0.01, len(X))
    fit = fit_curve(X, y, horizon=1280)
    assert fit.asymptote == pytest.approx(0.6, abs=0.02) and fit.midpoint == pytest.approx(300, rel=0.1)
    assert fit.asymptote_lo <= 0.6 <= fit.asymptote_hi and fit.midpoint_lo <= 300 <= fit.midpoint_hi
    assert fit.rmse < 0.015


def test_the_first_half_of_a_noisy_curve_predicts_its_end():
    rng = np.random.default_rng(0)
    y = sigmoid(X, 0.1, 0.6, 200.0, 1.5) + rng.normal(0, 0.03, len(X))
    half = fit_curve(X[:20], y[:20], horizon=1280)
    assert abs(float(half.predict([X[-1]])[0]) - float(sigmoid(X[-1:], 0.1, 0.6, 200.0, 1.5)[0])) < 0.06
    assert half.asymptote_lo < 0.6 < half.asymptote_hi


def test_a_flat_run_is_told_apart_from_a_rising_one_at_half_its_budget():
    """Twenty noisy points each (sd 0.05) of a 40-step budget: the flat run's interval holds its
    level, and lies wholly below the rising run's."""
    rng = np.random.default_rng(1)
    flat = 0.1 + rng.normal(0, 0.05, 20)
    rising = sigmoid(X[:20], 0.1, 0.6, 300.0, 1.5) + rng.normal(0, 0.05, 20)
    f, r = fit_curve(X[:20], flat, horizon=1280), fit_curve(X[:20], rising, horizon=1280)
    assert f.asymptote_lo < flat.mean() < f.asymptote_hi < r.asymptote_lo < 0.6 < r.asymptote_hi


def test_too_few_points_fit_nothing_and_bounds_hold():
    assert fit_curve([0, 32, 64], [0.1, 0.2, 0.3]) is None
    fit = fit_curve([0, 32, 64, 96, 128], [0.2, 0.6, 0.9, 0.97, 0.99], bounds=(0.0, 1.0), horizon=640)
    assert 0.0 <= fit.asymptote_lo <= fit.asymptote <= fit.asymptote_hi <= 1.0


def test_run_curves_fit_rewards_by_step_and_eval_points_apart():
    history = [{"step": 0, "eval/accuracy": 0.1}] + [
        {"step": s, "reward/mean": float(sigmoid(np.array([s * 16.0]), 0.1, 0.7, 160.0, 2.0)[0])} for s in range(1, 9)]
    out = run_curves(history, samples_per_step=16, min_points=4, steps=20)
    assert out["reward/curve/asymptote"] == pytest.approx(0.7, abs=0.05)
    assert not any(k.startswith("eval/curve") for k in out)  # one eval point: nothing to fit
    assert set(out) == {f"reward/curve/{k}" for k in ("asymptote", "asymptote_lo", "asymptote_hi", "midpoint",
                                                        "midpoint_lo", "midpoint_hi", "rmse")}


def test_a_trial_that_cannot_reach_the_leader_stops_after_min_steps(tmp_path):
    lead = {"reward/curve/asymptote": 0.8, "reward/curve/asymptote_lo": 0.5, "reward/curve/asymptote_hi": 1.0}
    post(tmp_path, "t00", 10, lead, "reward/mean")
    (tmp_path / "t02.json").write_text('{"lo": ')  # a torn file is skipped, not trusted
    mine = post(tmp_path, "t01", 3, {"reward/curve/asymptote": 0.1, "reward/curve/asymptote_lo": 0.05,
                                     "reward/curve/asymptote_hi": 0.2}, "reward/mean")
    best = leader(tmp_path, "t01")
    assert best["trial"] == "t00" and json.loads((tmp_path / "t01.json").read_text())["hi"] == 0.2
    assert verdict(mine, best, 3, 4, "reward/mean") is None  # before min_steps
    why = verdict(mine, best, 4, 4, "reward/mean")
    assert why.startswith("early stop at step 4") and "t00" in why and "0.500" in why
    close = {**mine, "hi": 0.6}  # intervals overlap: it could still win
    assert verdict(close, best, 9, 4, "reward/mean") is None
    assert post(tmp_path, "t03", 2, {}, "reward/mean") is None and verdict(None, best, 9, 4, "reward/mean") is None
