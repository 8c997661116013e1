"""The data, model and evaluation sections: where the files are, which model, how it is judged."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from hindsight.config.base import RewardSpec, Strict


# DataConfig field -> the columns each stage needs in that file
FILES = {"prompts": ("prompt",), "eval": ("prompt",), "sft": ("prompt", "completion"),
         "prefs": ("prompt", "chosen", "rejected")}


class DataConfig(Strict):
    dir: str = "data"
    dvc_file: str | None = "data.dvc"
    build_demo: bool = Field(True, description="build the demo data into data.dir when the config reads the demo's "
                                               "files and they are missing (never into a folder holding other files)")
    demo: Literal["sums", "tool_sums", "gsm8k_format"] = Field(
        "sums", description="which demo build_demo makes: sums (the default demo), tool_sums (the multi-turn "
                            "demos' 3-digit sums), gsm8k_format (GSM8K-format word problems, the real-model recipe's)")
    prompts: str = "data/prompts.jsonl"
    eval: str = "data/eval.jsonl"
    sft: str = "data/sft.jsonl"
    prefs: str = "data/prefs.jsonl"
    columns: dict[str, str | dict[str, str]] = Field(
        default_factory=dict, description="rename source columns: for every file (question: prompt), or for one "
                                          "file under its name (sft: {answer: completion}), which wins over the former")
    prompt_format: Literal["as_is", "chat"] = Field(
        "as_is", description="chat: a plain-text prompt becomes a user turn of the model's chat template, and a "
                             "plain completion, chosen or rejected text the assistant's turn (TRL's conversational "
                             "format), in every stage; as_is: text is prompted as it is")
    system_prompt: str | None = Field(None, description="prompt_format chat: a system turn before every prompt "
                                                        "that has none")
    split: str = "train"
    eval_split: str = "test"
    max_prompt_tokens: int | None = Field(None, ge=1, description="the longest prompt (prompts and eval), in "
                                          "tokens after the chat template; longer ones are refused before any "
                                          "model loads. Default: the model's context less the tokens it generates")

    @field_validator("columns")
    @classmethod
    def _per_file(cls, value: dict) -> dict:
        for key, mapping in value.items():
            if isinstance(mapping, dict) and key not in FILES:
                raise ValueError(f"columns.{key}: a mapping for one file goes under the file's name, one of "
                                 f"{sorted(FILES)}; a plain rename is `source: target`")
        return value

    @model_validator(mode="after")
    def _system_needs_chat(self):
        if self.system_prompt is not None and self.prompt_format != "chat":
            raise ValueError("system_prompt is a chat turn: set data.prompt_format: chat as well")
        return self

    def columns_for(self, name: str) -> dict[str, str]:
        """The renames applied to file `name`: the ones for every file, then its own."""
        every = {k: v for k, v in self.columns.items() if isinstance(v, str)}
        own = self.columns.get(name)
        return {**every, **own} if isinstance(own, dict) else every

    def reading(self, name: str, limit: int | None = None) -> dict:
        """`load_rows`' arguments for file `name` (prompts, eval, sft, prefs): plain values, so a
        launched trainer gets them too."""
        return {"source": getattr(self, name), "required": FILES[name],
                "split": self.eval_split if name == "eval" else self.split,
                "columns": self.columns_for(name) or None, "limit": limit,
                "chat": {"system": self.system_prompt} if self.prompt_format == "chat" else None,
                "key": f"data.{name}"}


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
    max_weight_abs: float = Field(1e4, gt=0, description="no stage checkpoints (RL) or registers a model with a "
                                  "weight beyond +-this: a trained model's weights stay far below it")

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
    registered: Literal["merged", "adapter"] = Field(
        "merged", description="what RL registers: merged, the adapter merged into its base (a plain model that "
                              "loads anywhere); adapter, the adapter alone, its base named by a hub id, an absolute "
                              "path or a models:/NAME/VERSION registry URI (docs/registry.md). SFT always merges")


class EvalConfig(Strict):
    limit: int | None = Field(200, ge=1)
    max_new_tokens: int = Field(8, ge=1)
    reward: RewardSpec = Field("rewards.exact:exact_answer", description="reward deciding correctness (score >= 1)")
    compare_prompts: int = Field(8, ge=1, description="fixed eval prompts answered by each registered policy version")
    compare_versions: int = Field(4, ge=0, description="newest registered policy versions in the comparison; "
                                                       "0 skips it (each version is loaded once per RL stage)")
