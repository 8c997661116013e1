"""KL-Cov (Cui et al., 2025, verl 'kl_cov'): the unclipped policy gradient, with a KL penalty
|log r| on the `max(1, ratio * tokens)` tokens of largest covariance of advantage and log-prob,
(A - mean A)(log p - mean log p): those tokens drive the collapse of entropy."""
from __future__ import annotations

from pydantic import Field

from hindsight.learning.losses.base import LOSSES, LossInputs, LossSettings, PolicyLoss


class KLCovSettings(LossSettings):
    kl_cov_ratio: float = Field(2e-4, gt=0, le=1, description="share of the tokens that get the penalty")
    ppo_kl_coef: float = Field(1.0, ge=0, description="the penalty's weight on |log r|")


@LOSSES.register
class KLCov(PolicyLoss):
    name = "kl_cov"
    Settings = KLCovSettings
    aggregation = "token_mean"

    @staticmethod
    def per_token(x: LossInputs, s: KLCovSettings):
        import torch

        adv = x.advantages.expand_as(x.mask)                                       # (B, T)
        log_r = x.logp - x.old_logp                                                # (B, T)
        plain = -adv * torch.exp(log_r)                                            # (B, T)
        valid = x.mask > 0
        flat = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]                 # (N,)
        penalised = torch.zeros_like(valid)                                        # (B, T) bool
        if len(flat):
            a, lp = adv[valid].detach(), x.logp[valid].detach()                    # (N,)
            cov = (a - a.mean()) * (lp - lp.mean())
            top = flat[torch.topk(cov, max(1, int(len(cov) * s.kl_cov_ratio))).indices]
            penalised.view(-1)[top] = True
        loss = torch.where(penalised, plain + s.ppo_kl_coef * log_r.abs(), plain)
        return loss, {"kl_cov_fraction": penalised}
