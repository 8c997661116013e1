"""The scoring block, `rl.scoring`: the reward functions, the learned reward's weight, and how a
reward that fails is treated."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from hindsight.config.base import RewardSpec, Strict


class RewardFnConfig(Strict):
    fn: RewardSpec = Field(description="module:function, called as TRL does: fn(prompts=, completions=, "
                                       "completion_ids=, **dataset columns, **args)")
    weight: float = 1.0
    args: dict[str, Any] = Field(default_factory=dict, description="the reward's own keyword arguments")
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$",
                             description="key of its scores and metrics; default the function's name, "
                                         "numbered when two rewards share it")


class ScoringConfig(Strict):
    rewards: list[RewardFnConfig] = Field(default_factory=lambda: [RewardFnConfig(fn="rewards.exact:exact_answer")])
    reward_model_weight: float = Field(0.0, ge=0, description="weight of the learned reward; 0 skips it")
    fallback: float = Field(0.0, description="score given when a reward function fails")
    failure_stop: float = Field(1.0, gt=0, le=1, description="stop the run when one reward fails on at least this "
                                "share of a step's completions (1.0: on every one); each step logs "
                                "reward/failure_rate/<name>")
    timeout_s: float = Field(60.0, gt=0, description="per call; a reward that overruns gets the fallback")
    isolation: Literal["process", "inline"] = Field(
        "process", description="process: rewards run in a killable worker process; inline: in the trainer")
