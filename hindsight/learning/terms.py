"""The loss terms beside the policy loss (`learning.losses`): the KL estimators, the critic's
clipped value loss, and unlikelihood on known-bad completions.

Shapes: B sequences, T completion tokens. `mask` (B, T) is 1 on real completion tokens.
"""
from __future__ import annotations

import torch


LOG_RATIO_CLAMP = 20.0  # verl's and OpenRLHF's bound: exp(20) is finite in float32, exp(89) is not


# Schulman's estimators of KL(pi || ref) from r = log(ref / pi) on samples of pi: (B, T) -> (B, T)
KL_ESTIMATORS = {
    "k1": lambda r: -r,
    "k2": lambda r: 0.5 * r.pow(2),
    "k3": lambda r: torch.exp(r) - r - 1,   # unbiased and >= 0
}


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3",
                mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from samples of pi (Schulman's k1/k2/k3).

    logp, ref_logp, mask: (B, T). Returns (B, T), 0 where mask is 0. k3 is unbiased and
    always >= 0. Padding is masked before the exponential: there the reference is padded with
    0.0 while the policy's log-prob of the pad token can be far below -89, and exp(inf) * 0
    would be NaN in the loss and every gradient.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator: {estimator}")
    log_ratio = (ref_logp - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)    # (B, T)  log(ref/pi)
    if mask is not None:
        log_ratio = torch.where(mask.bool(), log_ratio, torch.zeros_like(log_ratio))
    return KL_ESTIMATORS[estimator](log_ratio)


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
