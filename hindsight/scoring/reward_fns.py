"""A reward function, found by its 'module:function' spec: imported, checked against TRL's keyword
contract, and hashed (its source is part of a stage's cache key). Both the stage's process and
the guarded reward process load rewards through here."""
from __future__ import annotations

import hashlib
import importlib
from pathlib import Path

from hindsight.errors import RewardError


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
    """Load a reward, check that it can take TRL's keywords, and run its own `preflight(**args)`
    if it has one: a reward that cannot run here (the code reward without its sandbox, or a
    function that is no reward, such as `os:system`) refuses before any model loads."""
    fn = load_reward_fn(spec)
    _check_signature(spec, fn)
    check = getattr(fn, "preflight", None)
    if callable(check):
        try:
            check(**(args or {}))
        except Exception as exc:
            raise RewardError(f"reward {spec!r}: {exc}") from None
    return fn


def _check_signature(spec: str, fn) -> None:
    """TRL's contract calls a reward by keyword: prompts=, completions=, completion_ids= and the
    dataset's columns. One that cannot take `completions` by keyword, or needs an argument by
    position, could never score a completion."""
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        raise RewardError(f"reward {spec!r}: its signature cannot be read, so it cannot be checked against TRL's "
                          f"keyword contract (fn(prompts=, completions=, completion_ids=, **columns))") from None
    params = sig.parameters.values()
    by_keyword = any(p.kind is p.VAR_KEYWORD for p in params) or (
        "completions" in sig.parameters and sig.parameters["completions"].kind is not inspect.Parameter.POSITIONAL_ONLY)
    positional = [p.name for p in params if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if not by_keyword or positional:
        raise RewardError(f"reward {spec!r}: its signature {sig} cannot take TRL's keyword arguments "
                          f"(fn(prompts=, completions=, completion_ids=, **columns))")


def plain_result(raw):
    """A reward's return as plain Python (a numpy array or tensor as its list), else unchanged:
    what the worker process sends back, and what the inline path validates, are the same."""
    tolist = getattr(raw, "tolist", None)
    return tolist() if callable(tolist) and not isinstance(raw, (list, tuple, str, bytes, dict)) else raw


def reward_source_hash(spec: str) -> str:
    """A reward module's source: editing a user's reward outside our packages reruns the stage."""
    module = importlib.import_module(spec.partition(":")[0])
    source = getattr(module, "__file__", None)
    return hashlib.sha256(Path(source).read_bytes()).hexdigest()[:16] if source else "builtin"


def takes_run_context(fn) -> bool:
    """Whether a reward names a `run_context` parameter: it is handed the run's `RunContext`
    (where it may cache) as that argument; other rewards never see it (TRL's contract)."""
    import inspect

    try:
        return "run_context" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
