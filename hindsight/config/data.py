"""The data, model and evaluation sections: where the files are, which model, how it is judged."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

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
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


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
