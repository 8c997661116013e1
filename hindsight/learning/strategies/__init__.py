"""Learner strategies: importing this package registers the built-in ones (`ddp`, `fsdp2`);
`rl.learner.strategy` takes a registered name. `base.Strategy` is the contract."""
from hindsight.learning.strategies import replicated, sharded  # noqa: F401  (registration)
from hindsight.learning.strategies.base import STRATEGIES, Strategy, get_strategy, register, unregister  # noqa: F401
