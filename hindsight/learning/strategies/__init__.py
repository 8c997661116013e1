"""Learner strategies: `base.Strategy` is the contract, `catalogue` the registry (torch-free, so
the config imports it without torch); `rl.learner.strategy` takes a registered name. The built-in
ones (`ddp`, `fsdp2`) register when a strategy is first looked up."""
from hindsight.learning.strategies.catalogue import STRATEGIES, get_strategy, names, register  # noqa: F401
