"""Apply configured reward functions to a batch of completions.

A reward that raises, returns NaN or the wrong type gives the fallback score and a counted,
logged failure: one broken reward never takes a training run down. A reward that is not
importable, or returns the wrong number of scores, is a configuration bug and fails loudly.
"""
from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass, field

from hindsight.errors import RewardError
from hindsight.scoring.guarded import RewardExited, RewardRaised
from hindsight.scoring.reward_fns import (check_reward, load_reward_fn, plain_result, reward_source_hash,  # noqa: F401
                                          takes_run_context)

log = logging.getLogger("hindsight.scoring.rewards")
MAX_LOGGED_FAILURES = 3


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


def reward_weights(scoring, names: list[str]) -> list[float]:
    """The weight of each named score part (`experience.reward_parts`): a reward's, or the learned one's."""
    weights = {c.name: c.weight for c in reward_calls(scoring.rewards)}
    weights["rm_score"] = scoring.reward_model_weight
    return [weights.get(n, 0.0) for n in names]


@dataclass
class ScoreResult:
    total: list[float]
    per_fn: dict[str, list[float]]
    failures: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # each failing reward's first failure, as one line

    def failure_counts(self) -> dict[str, list]:
        """{reward: [failed calls, first failure or None]}: plain data, summed over scorers by
        `add_failures`, so the step can stop with the reward's own exception."""
        return {name: [n, self.errors.get(name)] for name, n in self.failures.items()}


def add_failures(total: dict[str, list], part: dict[str, list]) -> dict[str, list]:
    for name, (n, error) in part.items():
        count, first = total.get(name, (0, None))
        total[name] = [count + n, first or error]
    return total


def score_completions(specs, completions: list[str], columns: dict[str, list], fallback: float = 0.0,
                      worker=None, timeout_s: float = 60.0, prompts: list[str] | None = None,
                      completion_ids: list[list[int]] | None = None, context=None) -> ScoreResult:
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
    errors: dict[str, str] = {}
    total = [0.0] * len(completions)
    for call in reward_calls(specs):
        fn = load_reward_fn(call.fn)  # import errors surface here, in the parent, as a config error
        extra = {"run_context": context} if context is not None and takes_run_context(fn) else {}
        if worker is not None:
            fn = _remote(worker, call.fn, timeout_s)
        scores, n_failed, error = _call_reward(call.fn, fn, {**batch, **call.args, **extra}, fallback)
        per_fn[call.name] = scores
        failures[call.name] = n_failed
        if error:
            errors[call.name] = error
        total = [t + call.weight * s for t, s in zip(total, scores)]
    return ScoreResult(total, per_fn, failures, errors)


def _remote(worker, spec: str, timeout_s: float):
    return lambda **kwargs: worker.call(spec, kwargs, timeout_s)


def _call_reward(spec, fn, kwargs: dict, fallback) -> tuple[list[float], int, str | None]:
    """One reward call, inline or in the worker: both end in `validate_scores`. Returns the
    scores, how many failed, and the first failure."""
    completions = kwargs["completions"]
    try:
        raw = plain_result(fn(**kwargs))
    except (SystemExit, RewardExited) as exc:  # inline, this would end the whole command with its code
        raise RewardError(f"reward {spec!r} called sys.exit({exc.code!r}); a reward returns its scores, it never "
                          f"exits") from None
    except Exception as exc:  # the contract: a broken reward costs its scores, not the run
        log.warning("reward %s raised %s: %s (first completion: %r)", spec, type(exc).__name__, exc,
                    completions[0] if completions else None)
        cause = str(exc) if isinstance(exc, RewardRaised) else f"{type(exc).__name__}: {exc}"  # the same both ways
        return [fallback] * len(completions), len(completions), f"raised {cause}"[:500]
    scores, failed, first_bad = validate_scores(spec, raw, completions, fallback)
    return scores, failed, f"returned {first_bad!r} (not a finite number)"[:500] if failed else None


def validate_scores(spec: str, raw, completions: list, fallback: float) -> tuple[list[float], int, object]:
    """A list (or tuple) of one real number per completion. Another shape is the reward's bug and
    fails loudly; an element that is not a finite real number (None, NaN, a string) gets the
    fallback and is counted (the first such value is returned too). A string is never parsed: "1"
    is not a score."""
    if not isinstance(raw, (list, tuple)):
        shown = repr(raw)[:60]
        raise RewardError(f"reward {spec!r} returned {type(raw).__name__} {shown}, not a list of "
                          f"{len(completions)} scores")
    if len(raw) != len(completions):
        raise RewardError(f"reward {spec!r} returned {len(raw)} scores for {len(completions)} completions")
    scores, failed, first_bad = [], 0, None
    for completion, value in zip(completions, raw):
        if not isinstance(value, numbers.Real) and callable(getattr(value, "item", None)):
            try:
                value = value.item()  # a one-element tensor or array
            except (TypeError, ValueError, RuntimeError):
                pass
        ok = isinstance(value, numbers.Real) and math.isfinite(float(value))
        if not ok:
            first_bad = value if failed == 0 else first_bad
            failed += 1
            if failed <= MAX_LOGGED_FAILURES:
                log.warning("reward %s gave %r for completion %r; using fallback %s", spec, value, completion, fallback)
        scores.append(float(value) if ok else fallback)
    return scores, failed, first_bad
