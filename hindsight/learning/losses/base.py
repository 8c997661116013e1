"""A policy loss is one object: its settings block, its per-token maths, and how it is reduced.

Every advantage estimator (`hindsight.learning.algorithms`) plugs into every loss that accepts
its advantages. A class registered here is known to the config (`rl.learner.loss` takes its
name, `rl.learner.<name>:` holds its settings) and to the learner, with no other edit; the
parts every loss shares (the ratio, the off-policy correction, the KL term, the entropy bonus,
the reduction over a mini-batch) live in `objective.py`. docs/design.md walks through adding one.

Shapes: B sequences, T completion tokens. A loss at the sequence level works on (B, 1) ratios.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hindsight.registry import Registry

if TYPE_CHECKING:  # the config imports every loss for its block, and must not pay for torch
    import torch


class LossSettings(BaseModel):
    """A loss's own block under `rl.learner.<name>`; unknown keys fail like everywhere else."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class RatioSettings(LossSettings):
    ratio_level: Literal["token", "sequence"] = Field(
        "token", description="token: one ratio per token; sequence: GSPO's length-normalised sequence ratio "
                             "exp(mean_t log(pi/pi_old)), one per sequence (TRL's importance_sampling_level)")


class ClipSettings(RatioSettings):
    clip_eps_low: float = Field(0.2, ge=0, description="the ratio's lower clip is 1 - this (TRL's epsilon)")
    clip_eps_high: float = Field(0.2, ge=0, description="the upper clip is 1 + this (TRL's epsilon_high; DAPO's "
                                                        "clip-higher: 0.28)")
    delta: float | None = Field(None, gt=1, description="two-sided clip (INTELLECT-2): the unclipped ratio is capped "
                                                         "at delta too; null: off")
    clip_ratio_c: float | None = Field(None, gt=1, description="dual clip (verl): a negative advantage's loss is "
                                                               "capped at -A * clip_ratio_c; null: off")


@dataclass(frozen=True, kw_only=True)
class LossInputs:
    """What a loss's maths may read. Completions of one prompt are contiguous."""
    logp: torch.Tensor            # (B, T) the policy's log-probs of the sampled tokens, with gradient
    old_logp: torch.Tensor        # (B, T) the anchor: the learner's log-probs when the batch was sampled
    log_ratio: torch.Tensor       # (B, T), or (B, 1) at the sequence level: log(pi / pi_old)
    advantages: torch.Tensor      # (B, 1) or (B, T)
    mask: torch.Tensor            # (B, T) 1 on the tokens the policy chose
    is_weights: torch.Tensor | None = None  # (B, T) or (B, 1): the off-policy correction's, for a loss that takes it


class PolicyLoss:
    """Subclass, set the class attributes, implement `per_token`, decorate with `@LOSSES.register`.

    aggregation: how `objective.aggregate` reduces the per-token loss (token_mean,
    seq_mean_token_mean, seq_mean_token_sum_norm, seq_mean_token_sum).
    sequence_objective: the loss scores whole sequences, so it refuses per-token advantages (a critic's).
    takes_correction: the correction's weights enter its maths (VESPO) instead of multiplying its loss;
    correction_levels: the correction levels it accepts (None: all).
    """
    name: ClassVar[str]
    Settings: ClassVar[type[LossSettings]] = RatioSettings
    aggregation: ClassVar[str] = "token_mean"
    sequence_objective: ClassVar[bool] = False
    takes_correction: ClassVar[bool] = False
    correction_levels: ClassVar[tuple[str, ...] | None] = None

    @staticmethod
    def ratio_level(settings: LossSettings) -> str:
        return getattr(settings, "ratio_level", "token")

    @staticmethod
    def per_token(x: LossInputs, s: LossSettings) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(loss (B, T) or (B, 1), statistics: name -> (B, T) or (B, 1) values averaged over the mask)."""
        raise NotImplementedError


LOSSES: Registry[type[PolicyLoss]] = Registry("policy loss")


def get_loss(name: str) -> type[PolicyLoss]:
    return LOSSES.lookup(name)
