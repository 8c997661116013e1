"""CISPO (MiniMax-M1): clip the importance weight itself, detached, and multiply it into a
REINFORCE term, so a clipped token still passes gradient through its log-prob (TRL 'cispo')."""
from __future__ import annotations

from pydantic import Field

from hindsight.learning.losses.base import LOSSES, LossInputs, PolicyLoss, RatioSettings


class CISPOSettings(RatioSettings):
    clip_max: float = Field(5.0, gt=0, description="the weight's cap, ScaleRL's eps_max (TRL: epsilon_high with "
                                                   "loss_type cispo; it recommends 5.0)")


@LOSSES.register
class CISPO(PolicyLoss):
    name = "cispo"
    Settings = CISPOSettings
    aggregation = "token_mean"

    @staticmethod
    def per_token(x: LossInputs, s: CISPOSettings):
        import torch

        ratio = torch.exp(x.log_ratio)                                  # (B, T) or (B, 1)
        weight = ratio.clamp(max=s.clip_max).detach()
        loss = -weight * x.advantages * x.logp                          # (B, T)
        return loss, {"clip_fraction": (ratio > s.clip_max) & (x.advantages > 0)}
