"""GRPO: each completion's reward against its group's mean, scaled by the group's std."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from hindsight.learning.algorithms.base import AdvantageInputs, Algorithm, AlgorithmSettings, register


class GRPOSettings(AlgorithmSettings):
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="group: divide by each group's std; batch: by the batch std; none: centre only")
    multi_objective: Literal["sum_then_normalize", "normalize_then_sum"] = Field(
        "sum_then_normalize", description="several rewards: sum_then_normalize normalises their weighted sum; "
        "normalize_then_sum (GDPO) normalises each reward in its group, sums them weighted, then normalises the sum "
        "over the batch (TRL's multi_objective_aggregation)")


@register
class GRPO(Algorithm):
    name = "grpo"
    Settings = GRPOSettings
    min_group_size = 2
    group_size_reason = "compares completions within a group"

    @staticmethod
    def advantages(x: AdvantageInputs, s: GRPOSettings):
        import torch  # lazily: the config imports this file (base)

        from hindsight.learning.algorithms.advantages import gdpo_advantages, grpo_advantages, sequence_kl_penalty

        if s.multi_objective == "normalize_then_sum" and x.reward_parts is not None:
            parts, weights = x.reward_parts, x.reward_weights                                     # (B, K), (K,)
            if x.kl is not None:  # the KL penalty is one more objective, of weight 1
                penalty = sequence_kl_penalty(torch.zeros_like(x.rewards), x.kl, x.mask, x.kl_coef)  # (B,)
                parts = torch.cat([parts, penalty.to(parts.dtype).unsqueeze(1)], dim=1)          # (B, K + 1)
                weights = torch.cat([weights, weights.new_ones(1)])                              # (K + 1,)
            return gdpo_advantages(parts, weights, x.group_size), None                           # (B,)
        rewards = sequence_kl_penalty(x.rewards, x.kl, x.mask, x.kl_coef) if x.kl is not None else x.rewards  # (B,)
        return grpo_advantages(rewards, x.group_size, s.scale_rewards), None                                  # (B,)
