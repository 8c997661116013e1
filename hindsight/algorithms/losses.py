"""The clipped policy-gradient loss shared by every algorithm, and its KL estimators.

Shapes: B sequences, T completion tokens. `mask` (B, T) is 1 on real completion tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from samples of pi (Schulman's k1/k2/k3).

    logp, ref_logp: (B, T). Returns (B, T). k3 is unbiased and always >= 0.
    """
    log_ratio = ref_logp - logp                                   # (B, T)  log(ref/pi)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        return torch.exp(log_ratio) - log_ratio - 1
    raise ValueError(f"unknown KL estimator: {estimator}")


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      eps_low: float, eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic clipped objective, negated into a loss, with DAPO's asymmetric clip.

    logp, old_logp: (B, T); advantages: (B,) or (B, T). Returns (loss (B, T), ratio (B, T)).
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    ratio = torch.exp(logp - old_logp)                            # (B, T)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)       # (B, T)
    return -torch.min(ratio * adv, clipped * adv), ratio


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int | None = None) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar.

    token_mean: every token weighs the same (DAPO; TRL 'bnpo'/'dapo' on one batch).
    seq_mean_token_mean: mean per sequence, then over sequences (GRPO; TRL 'grpo').
    seq_mean_token_sum_norm: sum over tokens / (B * max_len), no length bias (Dr. GRPO).
    """
    mask = mask.to(per_token.dtype)                               # (B, T)
    if mode == "token_mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if mode == "seq_mean_token_mean":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if mode == "seq_mean_token_sum_norm":
        return (per_token * mask).sum() / (per_token.size(0) * (max_len or per_token.size(1)))
    raise ValueError(f"unknown loss aggregation: {mode}")


@dataclass(frozen=True)
class LossSettings:
    eps_low: float = 0.2
    eps_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    agg: str = "seq_mean_token_mean"
    max_len: int | None = None


def policy_loss(logp, old_logp, ref_logp, advantages, mask, s: LossSettings):
    """Clipped surrogate plus KL-in-loss. All inputs (B, T) except advantages (B,).

    Returns the scalar loss and detached statistics for logging.
    """
    per_token, ratio = clipped_surrogate(logp, old_logp, advantages, s.eps_low, s.eps_high)  # (B, T)
    kl = kl_estimate(logp, ref_logp, s.kl_estimator) if ref_logp is not None else torch.zeros_like(logp)
    if s.kl_coef:
        per_token = per_token + s.kl_coef * kl
    loss = aggregate(per_token, mask, s.agg, s.max_len)
    m = mask.to(logp.dtype)
    logp, kl, ratio = logp.detach(), kl.detach(), ratio.detach()  # statistics only, no graph
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    clipped = ((ratio < 1 - s.eps_low) & (adv < 0)) | ((ratio > 1 + s.eps_high) & (adv > 0))  # (B, T)
    n = m.sum().clamp(min=1.0)
    stats = {
        "kl": float((kl * m).sum() / n),
        "clip_fraction": float((clipped.to(m.dtype) * m).sum() / n),
        "approx_kl": float((0.5 * (logp - old_logp).pow(2) * m).sum() / n),
        "ratio_mean": float((ratio * m).sum() / n),
    }
    return loss, stats
