"""The clipped policy-gradient loss shared by every algorithm, and its KL estimators.

Shapes: B sequences, T completion tokens. `mask` (B, T) is 1 on real completion tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


LOG_RATIO_CLAMP = 20.0  # verl's and OpenRLHF's bound: exp(20) is finite in float32, exp(89) is not


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3",
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from samples of pi (Schulman's k1/k2/k3).

    logp, ref_logp, mask: (B, T). Returns (B, T), 0 where mask is 0. k3 is unbiased and
    always >= 0. Padding is masked before the exponential: there the reference is padded with
    0.0 while the policy's log-prob of the pad token can be far below -89, and exp(inf) * 0
    would be NaN in the loss and every gradient.
    """
    log_ratio = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)    # (B, T)  log(ref/pi)
    if mask is not None:
        log_ratio = torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio))
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        return torch.exp(log_ratio) - log_ratio - 1
    raise ValueError(f"unknown KL estimator: {estimator}")


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                      eps_low: float, eps_high: float, clip_ratio_c: float | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's pessimistic clipped objective, negated into a loss, with DAPO's asymmetric clip and
    verl's optional dual-clip: for a negative advantage the loss is capped at -A * clip_ratio_c,
    so one token whose ratio exploded cannot dominate the step.

    logp, old_logp: (B, T); advantages: (B,) or (B, T). Returns (loss (B, T), ratio (B, T)).
    """
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    ratio = torch.exp(logp - old_logp)                            # (B, T)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)       # (B, T)
    loss = -torch.min(ratio * adv, clipped * adv)                 # (B, T)
    if clip_ratio_c is not None:
        loss = torch.where(adv < 0, torch.min(loss, -adv * clip_ratio_c), loss)
    return loss, ratio


def tis_weights(old_logp: torch.Tensor, engine_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling: the learner's behaviour probability over the sampling
    engine's, capped, corrects the gap between the two (a different dtype and kernels, a
    nucleus renormalisation). old_logp, engine_logp: (B, T). Returns (B, T), no gradient."""
    return torch.exp(old_logp - engine_logp).clamp(max=cap).detach()


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int | None = None,
              totals=None) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar.

    token_mean: every token weighs the same (DAPO; TRL 'bnpo'/'dapo' on one batch).
    seq_mean_token_mean: mean per sequence, then over sequences (GRPO; TRL 'grpo').
    seq_mean_token_sum_norm: sum over tokens / (B * max_len), no length bias (Dr. GRPO).

    `totals` (`batching.Totals`) are the whole mini-batch's tokens and sequences when these
    rows are one micro-batch of it: the sum of its micro-batches' losses is then the
    mini-batch's loss, not a mean of micro-batch means. None: these rows are the whole batch.
    """
    mask = mask.to(per_token.dtype)                               # (B, T)
    tokens = totals.tokens if totals is not None else mask.sum().clamp(min=1.0)
    seqs = totals.seqs if totals is not None else per_token.size(0)
    if mode == "token_mean":
        return (per_token * mask).sum() / max(tokens, 1.0)
    if mode == "seq_mean_token_mean":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).sum() / seqs
    if mode == "seq_mean_token_sum_norm":
        return (per_token * mask).sum() / (seqs * (max_len or per_token.size(1)))
    raise ValueError(f"unknown loss aggregation: {mode}")


@dataclass(frozen=True, kw_only=True)
class LossSettings:
    """Named like `rl.learner`'s fields, so `update.learner_settings` fills them by name."""
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    loss_agg: str = "seq_mean_token_mean"
    max_len: int | None = None
    entropy_coef: float = 0.0
    clip_ratio_c: float | None = None


def policy_loss(logp, old_logp, ref_logp, advantages, mask, s: LossSettings, entropy=None, is_weights=None,
                totals=None):
    """Clipped surrogate, plus KL-in-loss, minus an entropy bonus. All inputs (B, T) except
    advantages, (B,) or (B, T). `kl_coef` here is the in-loss coefficient (0 when the KL
    penalty lives in the reward instead). The KL and entropy terms are added per token before
    the aggregation, so they are reduced exactly as the policy loss is (`loss_agg`).
    `is_weights` (B, T), when given, weight the surrogate only, as TRL does. `totals`: see
    `aggregate` (a micro-batch's part of its mini-batch's loss).

    Returns the scalar loss and detached statistics for logging.
    """
    per_token, ratio = clipped_surrogate(logp, old_logp, advantages, s.clip_eps_low, s.clip_eps_high,
                                         s.clip_ratio_c)                                  # (B, T)
    if is_weights is not None:
        per_token = per_token * is_weights
    kl = kl_estimate(logp, ref_logp, s.kl_estimator, mask) if ref_logp is not None else torch.zeros_like(logp)
    if s.kl_coef:
        per_token = per_token + s.kl_coef * kl
    if s.entropy_coef and entropy is not None:
        per_token = per_token - s.entropy_coef * entropy
    loss = aggregate(per_token, mask, s.loss_agg, s.max_len, totals)
    m = mask.to(logp.dtype)
    logp, kl, ratio = logp.detach(), kl.detach(), ratio.detach()  # statistics only, no graph
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    clipped = ((ratio < 1 - s.clip_eps_low) & (adv < 0)) | ((ratio > 1 + s.clip_eps_high) & (adv > 0))  # (B, T)
    n = m.sum().clamp(min=1.0)
    stats = {
        "kl": float((kl * m).sum() / n),
        "clip_fraction": float((clipped.to(m.dtype) * m).sum() / n),
        "approx_kl": float((0.5 * (logp - old_logp).pow(2) * m).sum() / n),
        "ratio_mean": float((ratio * m).sum() / n),
    }
    if s.clip_ratio_c is not None:
        stats["dual_clip_fraction"] = float((((ratio > s.clip_ratio_c) & (adv < 0)).to(m.dtype) * m).sum() / n)
    return loss, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip: float, totals=None) -> tuple[torch.Tensor, float]:
    """PPO's clipped value loss: the worse of the raw and the clipped prediction, halved, a mean
    over tokens (over the whole mini-batch's `totals.tokens` for one micro-batch of it).

    values, old_values, returns, mask: (B, T). Returns (scalar loss, fraction clipped).
    """
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)      # (B, T)
    raw_err, clip_err = (values - returns).pow(2), (clipped - returns).pow(2)  # (B, T)
    m = mask.to(values.dtype)
    n = m.sum().clamp(min=1.0)
    loss = 0.5 * (torch.max(raw_err, clip_err) * m).sum() / (max(totals.tokens, 1.0) if totals is not None else n)
    frac = float(((clip_err > raw_err).to(m.dtype) * m).sum() / n)
    return loss, frac


def unlikelihood_loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Welleck et al.'s unlikelihood: push down p(token) on completions known to be bad.

    logp, mask: (B, T). -log(1 - p) per token, masked mean. p is capped just below 1 so a
    near-certain bad token gives a large but finite loss.
    """
    p = logp.exp().clamp(max=1 - 1e-6)                                        # (B, T)
    per_token = -torch.log1p(-p)                                              # (B, T)
    m = mask.to(per_token.dtype)
    return (per_token * m).sum() / m.sum().clamp(min=1.0)
