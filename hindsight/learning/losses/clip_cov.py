"""Clip-Cov (Cui et al., 2025, verl 'clip_cov'): PPO's clipped surrogate, with the gradient of a
few tokens cut: among the tokens the clip left alone whose covariance of advantage and log-prob,
(A - mean A)(log p - mean log p), lies in (lb, ub), `max(1, ratio * tokens)` drawn at random (a
generator seeded from `seed`, so a step is reproducible) are taken out of the loss. The
covariance drives the collapse of entropy; cutting its largest terms keeps exploration."""
from __future__ import annotations

from pydantic import Field

from hindsight.learning.losses.base import LOSSES, LossInputs, LossSettings, PolicyLoss


class ClipCovSettings(LossSettings):
    clip_eps_low: float = Field(0.2, ge=0)
    clip_eps_high: float = Field(0.2, ge=0)
    clip_cov_ratio: float = Field(2e-4, gt=0, le=1, description="share of the tokens whose gradient is cut")
    clip_cov_lb: float = Field(1.0, description="covariance above this is a candidate")
    clip_cov_ub: float = Field(5.0, description="covariance below this is a candidate")
    seed: int = Field(0, description="the draw among candidates")


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


@LOSSES.register
class ClipCov(PolicyLoss):
    name = "clip_cov"
    Settings = ClipCovSettings
    aggregation = "token_mean"

    @staticmethod
    def per_token(x: LossInputs, s: ClipCovSettings):
        import torch

        adv = x.advantages.expand_as(x.mask)                                       # (B, T)
        ratio = torch.exp(x.logp - x.old_logp)                                     # (B, T)
        plain = -adv * ratio
        clipped = -adv * torch.clamp(ratio, 1 - s.clip_eps_low, 1 + s.clip_eps_high)
        by_clip = (clipped > plain) & (x.mask > 0)                                 # (B, T)
        logp = x.logp.detach()
        cov = (adv - masked_mean(adv, x.mask)) * (logp - masked_mean(logp, x.mask))  # (B, T)
        cov = cov.masked_fill((x.mask == 0) | by_clip, float("-inf"))
        n_cut = max(int(s.clip_cov_ratio * float(x.mask.sum())), 1)
        candidates = torch.nonzero((cov < s.clip_cov_ub) & (cov > s.clip_cov_lb) & (x.mask > 0))  # (K, 2)
        draw = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(s.seed))
        cut = candidates[draw[:n_cut]]
        keep = torch.ones_like(plain)                                              # (B, T)
        keep[cut[:, 0], cut[:, 1]] = 0
        return torch.maximum(plain, clipped) * keep, {"cov_cut_fraction": keep == 0, "clip_fraction": by_clip}
