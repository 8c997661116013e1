"""The off-policy correction every loss shares, and the sampler–learner gap it is measured by.

Two log-probs of each sampled token meet here: the anchor (the learner's own forward, what the
loss's ratio is taken against) and the engine's (what sampled it: vLLM's kernels, another dtype,
or in an async run with the correction on, the stale weights version s - k). Their ratio
w = p_anchor / p_engine is an importance weight: taken per token, per sequence (the product) or
as a geometric mean (the product's n-th root), then truncated into [clip_min, clip_max] or set
to 0 outside it (masked). The off-policy sequence mask (DeepSeek-V3.2) drops negative-advantage
sequences whose mean KL from the sampler exceeds a threshold.

Shapes: B sequences, T completion tokens; `mask` (B, T) is 1 on the tokens the policy chose.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class Correction:
    """The resolved `rl.learner.correction` block ('auto' already decided)."""
    level: str = "none"              # none / token / sequence / geometric
    action: str = "mask"             # truncate / mask
    clip_min: float | None = None
    clip_max: float | None = 3.0
    off_policy_mask: float | None = None  # the sequence mask's KL threshold; None: off
    recompute_anchor: bool = False   # async: the anchor is the learner's forward at the step's start

    @property
    def weighs(self) -> bool:
        return self.level != "none"


def importance_weights(anchor: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor, c: Correction
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, changed): (B, T) at the token level, (B, 1) otherwise; no gradient. `changed`
    marks the weights truncation or the mask moved. A token the engine could not score (NaN)
    counts as no gap, as TRL does."""
    diff = torch.nan_to_num((anchor - engine) * mask, nan=0.0)              # (B, T) log(p_anchor / p_engine)
    if c.level == "token":
        log_w = diff
    elif c.level == "sequence":
        log_w = diff.sum(-1, keepdim=True)                                  # (B, 1) log of the product
    elif c.level == "geometric":
        log_w = diff.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    else:
        raise ValueError(f"unknown correction level {c.level!r}")
    w = torch.exp(log_w).detach()
    if c.action == "truncate":
        kept = torch.clamp(w, min=c.clip_min, max=c.clip_max)
        return kept, kept != w
    lo = c.clip_min if c.clip_min is not None else -float("inf")
    hi = c.clip_max if c.clip_max is not None else float("inf")
    out = (w < lo) | (w > hi)
    return w.masked_fill(out, 0.0), out


def off_policy_sequence_mask(logp: torch.Tensor, sampling_logp: torch.Tensor, advantages: torch.Tensor,
                             mask: torch.Tensor, threshold: float) -> torch.Tensor:
    """(B, 1) 1 keeps a sequence: its advantage is >= 0, or its mean KL(sampler || policy),
    mean_t (log p_sampler - log p), is at most `threshold`. logp, sampling_logp, mask: (B, T);
    advantages (B, 1) or (B, T)."""
    kl = torch.nan_to_num(sampling_logp - logp.detach(), nan=0.0)           # (B, T)
    mean_kl = (kl * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    return ((advantages >= 0) | (mean_kl <= threshold)).to(mask.dtype)


QUANTILES = (0.01, 0.5, 0.99)


@torch.no_grad()
def gap_metrics(anchor: torch.Tensor, engine: torch.Tensor | None, mask: torch.Tensor, c: Correction) -> dict:
    """The sampler–learner gap of a step's batch, logged every step (docs/metrics.md). With no
    engine log-probs the engine's numbers are the anchor itself (hf in a sync run): the gap is 0."""
    names = ["mismatch_kl_k1", "mismatch_kl_k3", "max_token_gap", "corrected_fraction",
             *(f"ratio_p{round(q * 100):02d}" for q in QUANTILES)]
    on = mask.bool()
    if engine is None or not on.any():
        return {f"offpolicy/{k}": (1.0 if k.startswith("ratio_p") else 0.0) for k in names}
    d = torch.nan_to_num(anchor - engine, nan=0.0).double()[on]             # (N,) log(p_anchor / p_engine)
    ratio = torch.exp(d)
    out = {"mismatch_kl_k1": float((-d).mean()),                            # KL(engine || learner), k1
           "mismatch_kl_k3": float((ratio - 1 - d).mean()),                 # and k3: >= 0
           "max_token_gap": float(d.abs().max())}
    out.update({f"ratio_p{round(q * 100):02d}": float(torch.quantile(ratio, q)) for q in QUANTILES})
    changed = 0.0
    if c.weighs:
        _, moved = importance_weights(anchor, engine, mask, c)              # (B, T) or (B, 1)
        changed = float((moved.expand_as(mask) & on).sum()) / float(on.sum())
    out["corrected_fraction"] = changed
    return {f"offpolicy/{k}": v for k, v in out.items()}
