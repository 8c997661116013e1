"""The strategy registry, without torch: the config validates `rl.learner.strategy` against it,
and a cached rerun, which trains nothing, then never imports torch (seconds at start).

A strategy registers itself (`@register` on its class); the built-in ones are named with their
module here and imported the first time a strategy is looked up (`hindsight.registry`).
"""
from __future__ import annotations

from hindsight.registry import Registry

STRATEGIES: Registry[type] = Registry("learner strategy", built_in={
    "ddp": "hindsight.learning.strategies.replicated", "fsdp2": "hindsight.learning.strategies.sharded"})
register, names, check_name, get_strategy = STRATEGIES.register, STRATEGIES.names, STRATEGIES.check, STRATEGIES.lookup
