"""The data, model and evaluation sections: where the files are, which model, how it is judged."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from hindsight.config.base import RewardSpec, Strict


class DataConfig(Strict):
    dir: str = "data"
    dvc_file: str | None = "data.dvc"
    build_demo: bool = Field(True, description="regenerate the demo data when data/ is missing")
    prompts: str = "data/prompts.jsonl"
    eval: str = "data/eval.jsonl"
    sft: str = "data/sft.jsonl"
    prefs: str = "data/prefs.jsonl"
    columns: dict[str, str] = Field(default_factory=dict, description="rename source columns, e.g. question: prompt")
    split: str = "train"
    eval_split: str = "test"


class ModelConfig(Strict):
    base: str = Field("tiny://demo", description="hub id, local path, or tiny://NAME for the built-in demo model")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="compute dtype. A trained model (policy, critic) keeps float32 master weights and "
        "optimizer state and runs its forward under autocast to this dtype; a frozen one (reference, reward "
        "model, a rollout copy) is loaded in it. No float16: training in it needs a loss scaler")
    master_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="the trained weights' dtype; only float32 trains: see docs/fitting.md")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward (SFT, the reward "
                                         "model and RL): less memory for about a third more compute")

    @field_validator("master_dtype")
    @classmethod
    def _master_weights(cls, value: str) -> str:
        if value != "float32":
            raise ValueError(f"{value} weights under a plain AdamW lose the update (bf16 keeps 8 bits of mantissa: at "
                             f"lr 1e-6 one step changed 2% of the weights); keep float32 master weights and set "
                             f"model.dtype: bfloat16 for bf16 compute")
        return value


class LoraConfig(Strict):
    enabled: bool = False
    r: int = Field(8, ge=1)
    alpha: int = Field(16, ge=1)
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = "all-linear"


class EvalConfig(Strict):
    limit: int | None = Field(200, ge=1)
    max_new_tokens: int = Field(8, ge=1)
    reward: RewardSpec = Field("rewards.exact:exact_answer", description="reward deciding correctness (score >= 1)")
    compare_prompts: int = Field(8, ge=1, description="fixed eval prompts answered by each registered policy version")
    compare_versions: int = Field(4, ge=0, description="newest registered policy versions in the comparison; "
                                                       "0 skips it (each version is loaded once per RL stage)")
