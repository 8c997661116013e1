"""A tool call's arguments, checked before the call: the names the function takes, the types its
hints declare, and sizes within bounds. The arguments are the model's choice, and a tool or an
environment method runs with them (in process, for an environment): `look(width=10**9)` built
a 1 GB string before its answer was cut. A bad argument is an error turn the model reads."""
from __future__ import annotations

import inspect
import math
import typing
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_chars: int = 4096        # a string argument
    max_items: int = 256         # a list's items or an object's keys
    max_abs: float = 1e9         # a number's magnitude


DEFAULT_LIMITS = Limits()


def hints(fn) -> dict[str, object]:
    """The parameters' type hints (unresolvable ones are left unchecked)."""
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {}


def problem(fn, name: str, args: dict, limits: Limits) -> str | None:
    """Why `name(**args)` may not be called, or None."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    types = hints(fn)
    for key, value in args.items():
        why = _size(value, limits) or (_type(value, types[key]) if key in types and key in params else None)
        if why:
            return f"{name}() argument {key!r}: {why}"
    return None


def _size(value, limits: Limits) -> str | None:
    todo = [value]
    while todo:  # iteratively: the arguments came out of a parser that bounded their depth
        v = todo.pop()
        if isinstance(v, str) and len(v) > limits.max_chars:
            return f"a string of {len(v):,} characters, over the {limits.max_chars:,} an argument may have"
        if isinstance(v, (int, float)) and not isinstance(v, bool) and not (
                isinstance(v, int) and abs(v) <= limits.max_abs or isinstance(v, float) and math.isfinite(v)
                and abs(v) <= limits.max_abs):
            return f"{_short(v)} is beyond the {limits.max_abs:g} a number may reach here"
        if isinstance(v, (list, dict)):
            if len(v) > limits.max_items:
                return f"{len(v):,} items, over the {limits.max_items:,} an argument may have"
            todo.extend(v.values() if isinstance(v, dict) else v)
    return None


def _short(v) -> str:
    text = repr(v) if not isinstance(v, int) or v.bit_length() < 200 else f"an integer of {v.bit_length()} bits"
    return text[:60]


_SIMPLE = {int: (int,), float: (int, float), str: (str,), bool: (bool,), list: (list,), dict: (dict,)}


def _type(value, hint) -> str | None:
    """Why `value` does not fit `hint` (JSON's types against Python's hints), or None."""
    origin = typing.get_origin(hint) or hint
    if hint is typing.Any or hint is inspect.Parameter.empty:
        return None
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        options = typing.get_args(hint)
        return None if any(_type(value, h) is None for h in options) else f"{_short(value)} is none of {hint}"
    if origin is typing.Literal:
        return None if value in typing.get_args(hint) else f"{_short(value)} is not one of {typing.get_args(hint)}"
    if hint is type(None):
        return None if value is None else f"{_short(value)} is not null"
    allowed = _SIMPLE.get(origin)
    if allowed is None:
        return None  # a type JSON cannot name (a dataclass, ...): the tool checks it
    if isinstance(value, bool) and bool not in allowed:
        return f"{_short(value)} is a boolean, not {origin.__name__}"
    if not isinstance(value, allowed):
        return f"{_short(value)} is not {origin.__name__}"
    return None
