"""SAPO (2025): a soft, temperature-gated clip instead of a hard one: the ratio passes through
sigmoid(tau (r - 1)) * 4 / tau, with its own temperature for positive and negative advantages
(TRL 'sapo')."""
from __future__ import annotations

from pydantic import Field

from hindsight.learning.losses.base import LOSSES, LossInputs, PolicyLoss, RatioSettings


class SAPOSettings(RatioSettings):
    temperature_pos: float = Field(1.0, gt=0, description="tau for positive advantages (TRL sapo_temperature_pos)")
    temperature_neg: float = Field(1.05, gt=0, description="tau for the others (TRL sapo_temperature_neg)")


@LOSSES.register
class SAPO(PolicyLoss):
    name = "sapo"
    Settings = SAPOSettings
    aggregation = "seq_mean_token_mean"

    @staticmethod
    def per_token(x: LossInputs, s: SAPOSettings):
        import torch

        ratio = torch.exp(x.log_ratio)                                               # (B, T) or (B, 1)
        tau = torch.where(x.advantages > 0, s.temperature_pos, s.temperature_neg)   # (B, 1) or (B, T)
        gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
        loss = -gate * x.advantages                                                  # (B, T) or (B, 1)
        # how far the gate has closed: 1 at r = 1, towards 0 far off policy
        return loss, {"gate_mean": (4 * torch.sigmoid(tau * (ratio - 1)) * torch.sigmoid(-tau * (ratio - 1))).detach()}
