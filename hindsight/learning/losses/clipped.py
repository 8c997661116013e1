"""PPO's clipped surrogate, and the TRL loss types that differ from it only in how it is reduced.

grpo: a mean per sequence, then over sequences (TRL 'grpo'). dapo: every token weighs the same
over the mini-batch (TRL 'dapo', its default). bnpo: TRL's token mean over a device's batch; here
over the mini-batch, so it equals dapo (a budget never changes an update). dr_grpo: a sum over
tokens / (sequences * max_new_tokens), no length bias.
"""
from __future__ import annotations

from hindsight.learning.losses.base import LOSSES, ClipSettings, LossInputs, PolicyLoss


def clipped_surrogate(x: LossInputs, s: ClipSettings):
    """-min(r A, clip(r) A), with the optional two-sided (delta) and dual (clip_ratio_c) clips.

    Returns (loss (B, T) or (B, 1) as the ratio, {clip_fraction, [dual_clip_fraction]})."""
    import torch

    ratio = torch.exp(x.log_ratio)                                          # (B, T) or (B, 1)
    clipped = torch.clamp(ratio, 1 - s.clip_eps_low, 1 + s.clip_eps_high)
    unclipped = ratio.clamp(max=s.delta) if s.delta is not None else ratio
    adv = x.advantages                                                      # (B, 1) or (B, T)
    loss = -torch.min(unclipped * adv, clipped * adv)                       # (B, T) or (B, 1)
    stats = {"clip_fraction": ((ratio < 1 - s.clip_eps_low) & (adv < 0)) | ((ratio > 1 + s.clip_eps_high) & (adv > 0))}
    if s.clip_ratio_c is not None:
        loss = torch.where(adv < 0, torch.min(loss, -adv * s.clip_ratio_c), loss)
        stats["dual_clip_fraction"] = (ratio > s.clip_ratio_c) & (adv < 0)
    return loss, stats


class Clipped(PolicyLoss):
    Settings = ClipSettings

    @staticmethod
    def per_token(x: LossInputs, s: ClipSettings):
        return clipped_surrogate(x, s)


@LOSSES.register
class GRPO(Clipped):
    name = "grpo"
    aggregation = "seq_mean_token_mean"


@LOSSES.register
class DAPO(Clipped):
    name = "dapo"
    aggregation = "token_mean"


@LOSSES.register
class BNPO(Clipped):
    name = "bnpo"
    aggregation = "token_mean"


@LOSSES.register
class DrGRPO(Clipped):
    name = "dr_grpo"
    aggregation = "seq_mean_token_sum_norm"
