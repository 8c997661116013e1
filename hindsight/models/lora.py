"""LoRA in RL (`rl.lora`), as TRL does it: the policy is the base model plus a PEFT adapter,
and the reference is that same base with the adapter switched off, not a second copy in
memory. Checkpoints hold the adapter (with the tokenizer); an engine that cannot take an
adapter (vLLM) gets the merged weights; `load_causal_lm` on an adapter folder loads its base
and merges, so a registered adapter evaluates like any model.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_dir(path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path) -> str:
    """The base model an adapter folder was trained on (peft records where it was loaded from)."""
    return json.loads((Path(path) / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]


def with_adapter(base, lora):
    """A fresh adapter on `base`: only its weights train."""
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                     target_modules=lora.target_modules, task_type="CAUSAL_LM")
    return get_peft_model(base, cfg)


def load_adapter(base, adapter_dir, trainable: bool = True):
    from peft import PeftModel

    return PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=trainable)


def is_peft(model) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "merge_and_unload")


class AdapterDisabled:
    """The reference model as a view of the policy: every call runs with the adapter off, so it
    is exactly the base. Attribute access (config, parameters, device) goes to the policy."""

    def __init__(self, policy):
        self._policy = policy

    def __call__(self, *args, **kwargs):
        with self._policy.disable_adapter():
            return self._policy(*args, **kwargs)

    def eval(self):
        return self  # the reference never trains; the policy's own mode is the learner's business

    def __getattr__(self, name):
        return getattr(self._policy, name)


def engine_parameters(model) -> list:
    """(name, tensor) pairs an inference engine loads: the merged weights of an adapter model
    (on a copy: the policy keeps training its adapter), else the model's own parameters."""
    if is_peft(model):
        model = copy.deepcopy(model).merge_and_unload()
    return [(name, p.detach()) for name, p in model.named_parameters()]


def trainable_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
