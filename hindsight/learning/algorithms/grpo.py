"""GRPO: each completion's reward against its group's mean, scaled by the group's std."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from hindsight.learning.algorithms.base import AdvantageInputs, Algorithm, AlgorithmSettings, register


class GRPOSettings(AlgorithmSettings):
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="group: divide by each group's std; batch: by the batch std; none: centre only")


@register
class GRPO(Algorithm):
    name = "grpo"
    Settings = GRPOSettings
    min_group_size = 2
    group_size_reason = "compares completions within a group"

    @staticmethod
    def advantages(x: AdvantageInputs, s: GRPOSettings):
        from hindsight.learning.algorithms.advantages import grpo_advantages, sequence_kl_penalty  # torch: lazily (base)

        rewards = sequence_kl_penalty(x.rewards, x.kl, x.mask, x.kl_coef) if x.kl is not None else x.rewards  # (B,)
        return grpo_advantages(rewards, x.group_size, s.scale_rewards), None                                  # (B,)
