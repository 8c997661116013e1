"""The SFT, reward-model and negative-ft sections."""
from __future__ import annotations


from pydantic import Field, field_validator

from hindsight.config.base import Strict
from hindsight.config.data import LoraConfig


class SFTConfig(Strict):
    enabled: bool = True
    lr: float = Field(1e-3, gt=0)
    epochs: float = Field(3.0, gt=0)
    max_steps: int = Field(-1, description="-1: run `epochs` epochs")
    batch_size: int = Field(32, ge=1)
    max_length: int = Field(128, ge=8)
    lora: LoraConfig = Field(default_factory=LoraConfig)

    @field_validator("lora")
    @classmethod
    def _merged(cls, lora: LoraConfig) -> LoraConfig:
        if lora.registered != "merged":
            raise ValueError("SFT registers its adapter merged (the reward model and RL train on a plain model); "
                             "registered: adapter is for rl.lora")
        return lora


class RewardModelConfig(Strict):
    enabled: bool = True
    base: str | None = Field(None, description="default: the SFT output (X-sft@latest)")
    lr: float = Field(1e-3, gt=0)
    epochs: float = Field(1.0, gt=0)
    max_steps: int = -1
    batch_size: int = Field(32, ge=1)
    max_length: int = Field(128, ge=8)
    eval_fraction: float = Field(0.1, ge=0, lt=1, description="share of the preference pairs held out (never "
                                 "trained on) to measure pairwise accuracy, eval/pairwise_accuracy; 0: none")


class NegativeFTConfig(Strict):
    enabled: bool = Field(False, description="run the negative-sample stage after RL in `run pipeline`")
    init: str | None = Field(None, description="policy to fine-tune; default models:/NAME-policy@latest")
    lr: float = Field(1e-5, gt=0)
    steps: int = Field(20, ge=1)
    batch_size: int = Field(32, ge=1)
    quantile: float = Field(0.25, gt=0, le=1, description="negatives: the lowest-reward fraction of stored completions")
    positive_weight: float = Field(1.0, ge=0, description="weight of NLL on the best stored completions")
