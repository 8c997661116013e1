"""LUSPO (2026): GSPO's sequence-level clipped surrogate with each sequence's loss scaled by its
length: a sum over a sequence's tokens, then a mean over sequences (TRL 'luspo')."""
from __future__ import annotations

from typing import Literal

from hindsight.learning.losses.base import LOSSES, ClipSettings
from hindsight.learning.losses.clipped import Clipped


class LUSPOSettings(ClipSettings):
    ratio_level: Literal["token", "sequence"] = "sequence"


@LOSSES.register
class LUSPO(Clipped):
    name = "luspo"
    Settings = LUSPOSettings
    aggregation = "seq_mean_token_sum"
