"""The policy objective: a registered loss (`base.PolicyLoss`) plus what every loss shares, in
the order TRL's `GRPOTrainer._compute_loss` applies them, so each loss equals TRL's on the same
tensors: the ratio at the loss's level, the off-policy sequence mask, the entropy mask, the
off-policy correction's weights, the KL term (optionally weighted by the ratio), the reduction
over the mini-batch, and the entropy bonus.

Shapes: B sequences, T completion tokens. `mask` (B, T) is 1 on the tokens the policy chose.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hindsight.learning.terms import kl_estimate
from hindsight.learning.correction import Correction, importance_weights, off_policy_sequence_mask
from hindsight.learning.losses.base import LossInputs, LossSettings, get_loss


@dataclass(frozen=True, kw_only=True)
class Objective:
    """The learner's resolved view of `rl.learner` (loss, its block, correction, entropy) and `rl.kl`."""
    loss: str = "grpo"
    params: LossSettings | None = None        # the loss's own block; None: its defaults
    correction: Correction = field(default_factory=Correction)
    kl_coef: float = 0.0                      # in-loss coefficient (0 when the KL is in the reward)
    kl_estimator: str = "k3"
    kl_bias_correction: bool = False          # weight the KL term by the ratio (DeepSeek-V3.2; TRL's default)
    entropy_coef: float = 0.0
    top_entropy_quantile: float = 1.0
    max_len: int | None = None                # max_new_tokens, dr_grpo's constant

    @classmethod
    def named(cls, loss: str = "grpo", **kwargs) -> "Objective":
        """An objective from one flat set of keywords: the loss block's fields (clip_eps_high, ...)
        go to its block, the rest (kl_coef, entropy_coef, correction, ...) to the objective."""
        settings = get_loss(loss).Settings
        block = {k: kwargs.pop(k) for k in list(kwargs) if k in settings.model_fields}
        return cls(loss=loss, params=settings(**block), **kwargs)

    @property
    def cls(self):
        return get_loss(self.loss)

    @property
    def settings(self) -> LossSettings:
        return self.params if self.params is not None else self.cls.Settings()


# (masked per-token loss (B, T), mask (B, T), the mini-batch's tokens, its sequences, max_len) -> scalar
REDUCTIONS = {
    "token_mean": lambda x, m, tokens, seqs, max_len: x.sum() / max(tokens, 1.0),
    "seq_mean_token_mean": lambda x, m, tokens, seqs, max_len: (x.sum(-1) / m.sum(-1).clamp(min=1.0)).sum() / seqs,
    "seq_mean_token_sum_norm": lambda x, m, tokens, seqs, max_len: x.sum() / (seqs * max_len),
    "seq_mean_token_sum": lambda x, m, tokens, seqs, max_len: x.sum() / seqs,
}


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int | None = None,
              totals=None) -> torch.Tensor:
    """Reduce a (B, T) (or (B, 1), broadcast) per-token loss to a scalar.

    token_mean: every token weighs the same (DAPO, CISPO). seq_mean_token_mean: mean per sequence,
    then over sequences (GRPO, GSPO, SAPO). seq_mean_token_sum_norm: sum / (B * max_len) (Dr. GRPO).
    seq_mean_token_sum: sum per sequence, mean over sequences (LUSPO).

    `totals` (`batching.Totals`) are the whole mini-batch's tokens and sequences when these rows
    are one micro-batch of it: the sum of its micro-batches' losses is then the mini-batch's
    loss, not a mean of micro-batch means. None: these rows are the whole batch.
    """
    if mode not in REDUCTIONS:
        raise ValueError(f"unknown loss aggregation: {mode}")
    mask = mask.to(per_token.dtype)                                          # (B, T)
    tokens = totals.tokens if totals is not None else float(mask.sum())
    seqs = totals.seqs if totals is not None else mask.size(0)
    return REDUCTIONS[mode](per_token * mask, mask, tokens, seqs, max_len or mask.size(1))


def sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B, 1) the mean over each row's masked tokens."""
    return (x * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)


def entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """(B, T) 1 on the tokens whose entropy is in the top `quantile` of the masked ones (TRL's
    top_entropy_quantile, 'Beyond the 80/20 rule'), taken over these rows."""
    values = entropy.detach()[mask.bool()].float()
    if values.numel() == 0:
        return torch.zeros_like(mask)
    threshold = torch.quantile(values, 1 - quantile)
    return ((entropy.detach() * mask >= threshold) & mask.bool()).to(mask.dtype)


def policy_loss(logp, old_logp, ref_logp, advantages, mask, s: Objective, entropy=None, totals=None,
                engine_logp=None, entropy_coef: float | None = None):
    """The scalar loss of these rows and their statistics (token means). logp (with gradient), old_logp, ref_logp, engine_logp,
    mask, entropy: (B, T); advantages (B,) or (B, T). `engine_logp`: the sampler's own log-probs
    when they differ from the anchor `old_logp` (the correction's other side). `entropy_coef`
    overrides the settings' (an adaptive coefficient). `totals`: see `aggregate`."""
    loss_cls, p = s.cls, s.settings
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages          # (B, 1) or (B, T)
    m = mask.to(logp.dtype)                                                          # (B, T)
    log_ratio = logp - old_logp                                                      # (B, T)
    if loss_cls.ratio_level(p) == "sequence":
        log_ratio = sequence_mean(log_ratio, m)                                      # (B, 1)
    c = s.correction
    weights = changed = None
    if c.weighs and engine_logp is not None:
        weights, changed = importance_weights(old_logp, engine_logp, m, c)          # (B, T) or (B, 1)
    per_token, flags = loss_cls.per_token(LossInputs(logp=logp, old_logp=old_logp, log_ratio=log_ratio,
                                                     advantages=adv, mask=m, is_weights=weights), p)
    if c.off_policy_mask is not None:
        keep = off_policy_sequence_mask(logp, engine_logp if engine_logp is not None else old_logp, adv, m,
                                        c.off_policy_mask)                           # (B, 1)
        per_token = per_token * keep
        flags["offpolicy/sequence_masked_fraction"] = keep == 0
    eff = m
    if s.top_entropy_quantile < 1.0 and entropy is not None:
        eff = m * entropy_mask(entropy, m, s.top_entropy_quantile)                   # (B, T)
        per_token = per_token * eff
    if weights is not None and not loss_cls.takes_correction:
        per_token = per_token * weights
    kl = torch.zeros_like(logp)
    if ref_logp is not None:
        kl = kl_estimate(logp, ref_logp, s.kl_estimator, m)                          # (B, T)
    if s.kl_coef and ref_logp is not None:
        weighted = kl * torch.exp(log_ratio) if s.kl_bias_correction else kl
        per_token = per_token + s.kl_coef * weighted
    loss = aggregate(per_token, m, loss_cls.aggregation, s.max_len, totals)
    coef = s.entropy_coef if entropy_coef is None else entropy_coef
    if coef and entropy is not None:
        tokens = totals.tokens if totals is not None else float(m.sum())
        share = float(m.sum()) / max(tokens, 1.0)  # this micro-batch's part of the mini-batch's mean
        loss = loss - coef * share * (entropy * eff).sum() / eff.sum().clamp(min=1.0)
    return loss, _statistics(logp, old_logp, kl, m, flags, changed)


def _statistics(logp, old_logp, kl, m, flags: dict, changed) -> dict[str, float]:
    """The loss's statistics, each a mean over these rows' tokens."""
    logp, ratio = logp.detach(), torch.exp((logp - old_logp).detach())              # (B, T)
    sums = {"kl": (kl.detach() * m).sum(), "approx_kl": (0.5 * (logp - old_logp).pow(2) * m).sum(),
            "ratio_mean": (ratio * m).sum()}
    for name, flag in flags.items():
        sums[name] = (flag.to(m.dtype).expand_as(m) * m).sum()
    if changed is not None:
        sums["offpolicy/weight_changed_fraction"] = (changed.to(m.dtype).expand_as(m) * m).sum()
    n = float(m.sum()) or 1.0
    return {k: float(v) / n for k, v in sums.items()}
