"""GMPO (2025, verl 'geo_mean'): the geometric mean of the tokens' ratios instead of their
arithmetic mean, each token's log-ratio clipped in log space on the side its advantage points to:
loss = -A * exp(mean_t sgn(A) min(sgn(A) log r_t, sgn(A) clip(log r_t, -eps_low, eps_high))),
a mean over sequences. A sequence objective: it refuses per-token advantages."""
from __future__ import annotations

from pydantic import Field

from hindsight.learning.losses.base import LOSSES, LossInputs, LossSettings, PolicyLoss


class GMPOSettings(LossSettings):
    clip_eps_low: float = Field(0.4, ge=0, description="log-space clip below: the paper's (e^-0.4, e^0.4)")
    clip_eps_high: float = Field(0.4, ge=0, description="log-space clip above")


@LOSSES.register
class GMPO(PolicyLoss):
    name = "gmpo"
    Settings = GMPOSettings
    aggregation = "seq_mean_token_mean"  # of a (B, 1) loss: its mean over sequences
    sequence_objective = True
    takes_correction = True  # its token weights join the geometric mean (verl), not the arithmetic one

    @staticmethod
    def per_token(x: LossInputs, s: GMPOSettings):
        import torch

        log_r = x.logp - x.old_logp                                             # (B, T)
        sign = torch.sign(x.advantages)                                         # (B, 1)
        log_r_clip = log_r.clamp(-s.clip_eps_low, s.clip_eps_high)
        kept = sign * torch.min(sign * log_r, sign * log_r_clip)                # (B, T)
        n = x.mask.sum(-1, keepdim=True)                                        # (B, 1)
        ratio = torch.exp((kept * x.mask).sum(-1, keepdim=True) / (n + 1e-8))   # (B, 1)
        adv = (x.advantages * x.mask).sum(-1, keepdim=True) / (n + 1e-8)        # (B, 1)
        loss = -adv * ratio                                                     # (B, 1)
        if x.is_weights is not None:
            loss = loss * torch.exp((torch.log(x.is_weights + 1e-10) * x.mask).sum(-1, keepdim=True) / (n + 1e-8))
        return loss, {"clip_fraction": log_r != log_r_clip}
