"""RLOO: REINFORCE with each completion's baseline the mean reward of the others in its group."""
from __future__ import annotations

from hindsight.learning.algorithms.base import AdvantageInputs, Algorithm, AlgorithmSettings, register


@register
class RLOO(Algorithm):
    name = "rloo"
    min_group_size = 2
    group_size_reason = "compares completions within a group"

    @staticmethod
    def advantages(x: AdvantageInputs, s: AlgorithmSettings):
        from hindsight.learning.algorithms.advantages import rloo_advantages, sequence_kl_penalty  # torch: lazily (base)

        rewards = sequence_kl_penalty(x.rewards, x.kl, x.mask, x.kl_coef) if x.kl is not None else x.rewards  # (B,)
        return rloo_advantages(rewards, x.group_size), None                                                   # (B,)
