"""GSPO (Qwen, 2025): the clipped surrogate on one length-normalised ratio per sequence,
exp(mean_t log(pi / pi_old)), with the paper's narrow clip; a mean per sequence, then over
sequences. TRL spells it `loss_type: grpo` with `importance_sampling_level: sequence`."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from hindsight.learning.losses.base import LOSSES, ClipSettings
from hindsight.learning.losses.clipped import Clipped


class GSPOSettings(ClipSettings):
    ratio_level: Literal["token", "sequence"] = "sequence"
    clip_eps_low: float = Field(3e-4, ge=0, description="the GSPO paper's 3e-4")
    clip_eps_high: float = Field(4e-4, ge=0, description="the GSPO paper's 4e-4")


@LOSSES.register
class GSPO(Clipped):
    name = "gspo"
    Settings = GSPOSettings
    aggregation = "seq_mean_token_mean"
