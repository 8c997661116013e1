"""REINFORCE++: KL-shaped per-token returns whitened over the batch; no critic, any group size."""
from __future__ import annotations

from pydantic import Field

from hindsight.learning.algorithms.base import AdvantageInputs, Algorithm, AlgorithmSettings, register


class ReinforcePPSettings(AlgorithmSettings):
    gamma: float = Field(1.0, ge=0, le=1, description="discount over completion tokens")


@register
class ReinforcePP(Algorithm):
    name = "reinforce_pp"
    token_advantages = True
    Settings = ReinforcePPSettings

    @staticmethod
    def advantages(x: AdvantageInputs, s: ReinforcePPSettings):
        from hindsight.learning.algorithms.advantages import reinforce_pp_advantages  # torch: lazily (base)

        return reinforce_pp_advantages(x.rewards, x.mask, x.kl, x.kl_coef, s.gamma), None  # (B, T)
