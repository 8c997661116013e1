"""`lookback:`: what a run writes for people to look back at while it trains (traces, the fitted
curve, a sweep's early stop). None of it changes what is trained, so it is in no stage's cache key."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from hindsight.config.base import Strict


class EarlyStopConfig(Strict):
    """Set on each trial by a sweep with `early_stop.enabled` (see `SweepConfig.early_stop`)."""
    board: str | None = Field(None, description="folder where the sweep's trials post their fitted curves")
    metric: Literal["reward/mean", "eval/accuracy"] = Field("reward/mean", description="the curve whose asymptotes "
                                                                                       "are compared")
    min_steps: int = Field(4, ge=2, description="no trial stops before this many steps")


class LookbackConfig(Strict):
    traces_per_step: int = Field(8, ge=0, description="sampled trajectories written as MLflow traces each step "
                                                      "(whole groups first); 0: none")
    eval_traces: int = Field(64, ge=0, description="evaluation's greedy answers written as traces, each eval")
    curve_min_points: int = Field(4, ge=3, description="points before the saturating curve is fitted")
    early_stop: EarlyStopConfig = Field(default_factory=EarlyStopConfig)
