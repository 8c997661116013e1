"""The strategy registry, without torch: the config validates `rl.learner.strategy` against it,
and a cached rerun, which trains nothing, then never imports torch (seconds at start).

A strategy registers itself (`@register` on its class); the built-in ones are imported the first
time a strategy is looked up, so every name is known to `names()` and `get_strategy()` alike.
"""
from __future__ import annotations

import importlib

# the modules whose classes register the built-in strategies
BUILT_IN = {"ddp": "hindsight.learning.strategies.replicated", "fsdp2": "hindsight.learning.strategies.sharded"}
STRATEGIES: dict[str, type] = {}


def register(cls):
    STRATEGIES[cls.name] = cls
    return cls


def names() -> list[str]:
    return sorted(set(STRATEGIES) | set(BUILT_IN))


def check_name(name: str) -> str:
    """`name` if a strategy has it, else one ValueError naming those that exist; imports nothing."""
    if name not in STRATEGIES and name not in BUILT_IN:
        raise ValueError(f"unknown learner strategy {name!r}; registered: {', '.join(names())}")
    return name


def get_strategy(name: str):
    """The strategy class (`base.Strategy`) registered as `name`."""
    check_name(name)
    if name not in STRATEGIES:
        importlib.import_module(BUILT_IN[name])
    return STRATEGIES[name]
