"""VESPO (2026): no clip, a smooth asymmetric Gamma weight phi(w) = e^lam w^k e^(-lam w) of the
sequence's importance weight w (the engine correction's token weights folded in), detached, on a
REINFORCE term (TRL 'vespo'). It takes the correction inside, so only token-level corrections."""
from __future__ import annotations

import math

from pydantic import Field

from hindsight.learning.losses.base import LOSSES, LossInputs, PolicyLoss, RatioSettings


class VESPOSettings(RatioSettings):
    k_pos: float = Field(2.0, description="power for non-negative advantages (TRL vespo_k_pos)")
    lambda_pos: float = Field(3.0, description="decay for non-negative advantages (TRL vespo_lambda_pos)")
    k_neg: float = Field(3.0, description="power for negative advantages (TRL vespo_k_neg)")
    lambda_neg: float = Field(2.0, description="decay for negative advantages (TRL vespo_lambda_neg)")


def gamma_weights(x: LossInputs, s: VESPOSettings):
    """(B, 1) phi(w), computed in log space; w = prod_t pi/pi_old (times the correction's weights)."""
    import torch

    with torch.no_grad():
        floor = math.log(1e-8)
        log_tok = (x.logp - x.old_logp).clamp(-20.0, 20.0)                     # (B, T)
        log_w = (log_tok * x.mask).sum(-1, keepdim=True)                       # (B, 1)
        if x.is_weights is not None:
            log_w = log_w + torch.log(x.is_weights).clamp(floor, 20.0).sum(-1, keepdim=True)
        log_w = log_w.clamp(floor, 20.0)
        pos = x.advantages >= 0                                                # (B, 1)
        k = torch.where(pos, s.k_pos, s.k_neg)
        lam = torch.where(pos, s.lambda_pos, s.lambda_neg).clamp(min=1e-4)
        phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
        return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)                # (B, 1)


@LOSSES.register
class VESPO(PolicyLoss):
    name = "vespo"
    Settings = VESPOSettings
    aggregation = "token_mean"
    sequence_objective = True
    takes_correction = True
    correction_levels = ("token",)

    @staticmethod
    def per_token(x: LossInputs, s: VESPOSettings):
        phi = gamma_weights(x, s)                                              # (B, 1)
        return -phi * x.advantages * x.logp, {"phi_mean": phi}
