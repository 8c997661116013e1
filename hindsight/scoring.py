"""Apply configured reward functions to a batch of completions.

A reward that raises, returns NaN or the wrong type gives the fallback score and a counted,
logged failure: one broken reward never takes a training run down. A reward that is not
importable, or returns the wrong number of scores, is a configuration bug and fails loudly.
"""
from __future__ import annotations

import importlib
import logging
import math
from dataclasses import dataclass, field

from hindsight.errors import RewardError

log = logging.getLogger("hindsight.scoring")
MAX_LOGGED_FAILURES = 3


def load_reward_fn(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise RewardError(f"reward {spec!r}: expected 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise RewardError(f"reward {spec!r}: cannot import module {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"reward {spec!r}: module {module_name!r} has no function {attr!r}")
    return fn


def reward_name(spec: str) -> str:
    return spec.rpartition(":")[2]


@dataclass
class ScoreResult:
    total: list[float]
    per_fn: dict[str, list[float]]
    failures: dict[str, int] = field(default_factory=dict)


def score_completions(specs: list[tuple[str, float]], completions: list[str], columns: dict[str, list],
                      fallback: float = 0.0, worker=None, timeout_s: float = 60.0) -> ScoreResult:
    """Weighted sum of reward functions. `columns` map a dataset field to one value per completion.

    With a `RewardWorker`, each call runs in its process and is bounded by `timeout_s`;
    without one, calls run inline (for tests and trusted rewards).
    """
    per_fn: dict[str, list[float]] = {}
    failures: dict[str, int] = {}
    total = [0.0] * len(completions)
    for spec, weight in specs:
        name = reward_name(spec)
        fn = load_reward_fn(spec)  # import errors surface here, in the parent, as a config error
        if worker is not None:
            fn = _remote(worker, spec, timeout_s)
        scores, n_failed = _call_reward(spec, fn, completions, columns, fallback)
        per_fn[name] = scores
        failures[name] = n_failed
        total = [t + weight * s for t, s in zip(total, scores)]
    return ScoreResult(total, per_fn, failures)


def _remote(worker, spec: str, timeout_s: float):
    return lambda completions, **columns: worker.call(spec, completions, columns, timeout_s)


def _call_reward(spec, fn, completions, columns, fallback) -> tuple[list[float], int]:
    try:
        raw = fn(completions, **columns)
    except Exception as exc:  # the contract: a broken reward costs its scores, not the run
        log.warning("reward %s raised %s: %s (first completion: %r)", spec, type(exc).__name__, exc,
                    completions[0] if completions else None)
        return [fallback] * len(completions), len(completions)
    if raw is None or len(raw) != len(completions):
        got = "None" if raw is None else f"{len(raw)} scores"
        raise RewardError(f"reward {spec!r} returned {got} for {len(completions)} completions")
    scores, failed = [], 0
    for completion, value in zip(completions, raw):
        try:
            value = float(value) if value is not None else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if math.isnan(value) or math.isinf(value):
            failed += 1
            if failed <= MAX_LOGGED_FAILURES:
                log.warning("reward %s gave %r for completion %r; using fallback %s", spec, value, completion, fallback)
            value = fallback
        scores.append(value)
    return scores, failed
