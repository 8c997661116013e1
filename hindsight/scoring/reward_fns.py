"""A reward function, found by its 'module:function' spec: imported, checked against TRL's keyword
contract, and hashed (its source is part of a stage's cache key). Both the stage's process and
the guarded reward process load rewards through here."""
from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

from hindsight import PACKAGES
from hindsight.errors import RewardError


def load_reward_fn(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise RewardError(f"reward {spec!r}: expected 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise RewardError(shadowed(spec, module_name) or f"reward {spec!r}: cannot import module {module_name!r} "
                                                          f"({exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"reward {spec!r}: module {module_name!r} has no function {attr!r}")
    return fn


def shadowed(spec: str, module_name: str) -> str | None:
    """When a user's module and one of hindsight's own packages want the same name (the
    design's example, `rewards/math_reward.py` beside the config, while `rewards` is hindsight's
    reward package), the error that says how to name it; else None.

    Either ours took the name (the user's module is then not found), or the user's folder did,
    as a namespace package without __init__.py (an editable install's finder loses to one):
    hindsight's built-in rewards would then be the ones that vanish."""
    top, _, rest = module_name.partition(".")
    if top not in PACKAGES or not rest:
        return None
    bound = sys.modules.get(top)
    if bound is not None and getattr(bound, "__file__", None) is None:  # a namespace: the user's folder won
        folders = [Path(p) for p in getattr(bound, "__path__", [])]
        return _rename(spec, top, rest, folders[0] if folders else Path(top))
    relative = Path(*module_name.split("."))
    for folder in [Path.cwd(), *(Path(p) for p in sys.path if p)]:
        if (folder / relative).with_suffix(".py").is_file() or (folder / relative / "__init__.py").is_file():
            mine = folder / top
            ours = getattr(importlib.import_module(top), "__file__", None)
            if ours and mine.resolve() != Path(ours).resolve().parent and not _our_copy(mine, Path(ours)):
                return _rename(spec, top, rest, mine)
    return None


def _our_copy(folder: Path, ours: Path) -> bool:
    """Whether `folder` is hindsight's own package in another checkout (an editable install of
    one clone, PYTHONPATH on another): its __init__.py is ours, byte for byte."""
    init = folder / "__init__.py"
    try:
        return init.is_file() and init.read_bytes() == ours.read_bytes()
    except OSError:
        return False


def _rename(spec: str, top: str, rest: str, mine: Path) -> str:
    yours = (mine / Path(*rest.split("."))).with_suffix(".py").is_file() or (mine / Path(*rest.split("."))).is_dir()
    then = (f"name the reward my_{top}.{rest}:{spec.partition(':')[2]}" if yours
            else f"hindsight's own {top}.{rest} is hidden while it keeps the name")
    return (f"reward {spec!r}: {mine} is your own folder, but `{top}` is hindsight's own package, which takes "
            f"the name; rename your folder (for example my_{top}/) and {then}")


def check_reward(spec: str, args: dict | None = None):
    """Load a reward, check that it can take TRL's keywords, and run its own `preflight(**args)`
    if it has one: a reward that cannot run here (the code reward without its sandbox, or a
    function that is no reward, such as `os:system`) refuses before any model loads. A module
    that imported but from a package of ours while the user has a folder of that name is checked
    here, once, not at every call (`shadowed`)."""
    fn = load_reward_fn(spec)
    taken = shadowed(spec, spec.partition(":")[0])
    if taken:
        raise RewardError(taken)
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


# what every reward call gets besides the dataset's columns and its own `args` (rewards.py, the
# scorer, evaluate.py): TRL's keywords, the run's context, and a multi-turn environment's reward
PASSED = frozenset({"prompts", "completions", "completion_ids", "run_context", "env_reward"})


def missing_columns(fn, columns: set[str], args: dict | None) -> list[str]:
    """The parameters a reward requires (no default) that no call would pass: not TRL's keywords,
    not a column of the data, not one of its `args`. Such a reward fails on every completion."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    given = PASSED | columns | set(args or {})
    return [p.name for p in params if p.default is p.empty and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.name not in given]


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
