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


def check_reward(spec: str, args: dict | None = None):
    """Load a reward and run its own `preflight(**args)` if it has one: a reward that cannot
    run here (the code reward without its sandbox) refuses before any model loads."""
    fn = load_reward_fn(spec)
    check = getattr(fn, "preflight", None)
    if callable(check):
        try:
            check(**(args or {}))
        except Exception as exc:
            raise RewardError(f"reward {spec!r}: {exc}") from None
    return fn


def reward_name(spec: str) -> str:
    return spec.rpartition(":")[2]


@dataclass(frozen=True)
class RewardCall:
    """One configured reward: `fn` ('module:function'), its weight, its own keyword arguments
    (`args:` in YAML) and the unique name its scores and metrics are keyed by."""
    fn: str
    weight: float = 1.0
    args: dict = field(default_factory=dict)
    name: str = ""


def reward_calls(items) -> list[RewardCall]:
    """RewardFnConfig entries, (fn, weight) pairs or RewardCalls -> calls with unique names: a
    second reward with the same function name is keyed NAME_2, so their metrics never collide."""
    calls, seen = [], {}
    for item in items:
        if isinstance(item, tuple):
            item = RewardCall(*item)
        name = getattr(item, "name", None) or reward_name(item.fn)
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name = f"{name}_{seen[name]}"
        calls.append(RewardCall(item.fn, item.weight, dict(getattr(item, "args", None) or {}), name))
    return calls


@dataclass
class ScoreResult:
    total: list[float]
    per_fn: dict[str, list[float]]
    failures: dict[str, int] = field(default_factory=dict)


def score_completions(specs, completions: list[str], columns: dict[str, list], fallback: float = 0.0,
                      worker=None, timeout_s: float = 60.0, prompts: list[str] | None = None,
                      completion_ids: list[list[int]] | None = None) -> ScoreResult:
    """Weighted sum of reward functions, each called as TRL calls it: by keyword, with
    `prompts=`, `completions=`, `completion_ids=`, every dataset column (one value per
    completion) and the reward's own `args`.

    With a `RewardWorker`, each call runs in its process and is bounded by `timeout_s`;
    without one, calls run inline (for tests and trusted rewards).
    """
    batch = {**columns, "completions": completions}
    if prompts is not None:
        batch["prompts"] = prompts
    if completion_ids is not None:
        batch["completion_ids"] = completion_ids
    per_fn: dict[str, list[float]] = {}
    failures: dict[str, int] = {}
    total = [0.0] * len(completions)
    for call in reward_calls(specs):
        fn = load_reward_fn(call.fn)  # import errors surface here, in the parent, as a config error
        if worker is not None:
            fn = _remote(worker, call.fn, timeout_s)
        scores, n_failed = _call_reward(call.fn, fn, {**batch, **call.args}, fallback)
        per_fn[call.name] = scores
        failures[call.name] = n_failed
        total = [t + call.weight * s for t, s in zip(total, scores)]
    return ScoreResult(total, per_fn, failures)


def _remote(worker, spec: str, timeout_s: float):
    return lambda **kwargs: worker.call(spec, kwargs, timeout_s)


def _call_reward(spec, fn, kwargs: dict, fallback) -> tuple[list[float], int]:
    completions = kwargs["completions"]
    try:
        raw = fn(**kwargs)
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
