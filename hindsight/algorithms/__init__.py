"""RL algorithms: importing this package registers the built-in ones (see `base.register`)."""
from hindsight.algorithms import grpo, ppo, reinforce_pp, rloo  # noqa: F401  (registration)
from hindsight.algorithms.base import ALGORITHMS, Algorithm, get_algorithm, register, unregister  # noqa: F401
