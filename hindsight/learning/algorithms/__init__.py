"""RL algorithms: importing this package registers the built-in ones (see `base.register`)."""
from hindsight.learning.algorithms import grpo, ppo, reinforce_pp, rloo  # noqa: F401  (registration)
from hindsight.learning.algorithms.base import ALGORITHMS, Algorithm, get_algorithm, register, unregister  # noqa: F401
