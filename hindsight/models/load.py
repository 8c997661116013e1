"""Load policy, reference and reward models (a hub id, a local path or a `tiny://` model).

Every stage loads models through `load_causal_lm` / `load_reward_model`, so a hub id,
a local path and the demo model (`models.tiny`) all take the same `from_pretrained` path.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from hindsight.errors import CheckpointError, ConfigError

log = logging.getLogger("hindsight.models")


def disable_dropout(model) -> None:
    """Dropout off in every module (TRL does the same for RL): rollouts sample in eval mode and
    the update runs in train mode, so with dropout the ratio would not be 1 before any step."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for attr in ("attention_dropout", "dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop"):
            if isinstance(getattr(module, attr, None), float):
                setattr(module, attr, 0.0)


def resolve_model_path(name_or_path: str, cache_dir: str | Path = ".hindsight/models",
                       field: str = "model.base") -> str:
    """`tiny://demo` or `tiny://qwen2` builds (once) a tiny model in code; a local path must exist;
    a hub id passes."""
    if name_or_path.startswith("tiny://"):
        from hindsight.models.tiny import TINY

        name = name_or_path.removeprefix("tiny://")
        if name not in TINY:
            raise ConfigError(f"{field}: {name_or_path}: no such built-in model (tiny://{', tiny://'.join(TINY)})")
        target = Path(cache_dir) / name
        if not target.exists():
            TINY[name](target)
        return str(target)
    looks_local = name_or_path.startswith((".", "/", "~")) or Path(name_or_path).exists()
    if looks_local and not Path(name_or_path).expanduser().is_dir():
        raise ConfigError(f"{field}: model path {name_or_path} does not exist (expected a model folder)")
    return name_or_path


def _loading(path: str, what: str, load):
    """from_pretrained fails in many ways (missing files, truncated safetensors, offline hub);
    each becomes one error naming the path."""
    try:
        return load()
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(f"{path}: cannot load {what} ({type(exc).__name__}: {first})") from exc


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tok = _loading(path, "tokenizer", lambda: AutoTokenizer.from_pretrained(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def default_device() -> torch.device:
    """The GPU when there is one: RL models load there, and batches follow the model's device."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_causal_lm(path: str, dtype: str = "float32"):
    """A causal LM; a LoRA adapter folder (an RL policy trained with `rl.lora`) loads on its base
    and is merged, so it evaluates and fine-tunes like any model."""
    from transformers import AutoModelForCausalLM

    from hindsight.models.lora import adapter_base, is_adapter_dir, load_adapter

    if is_adapter_dir(path):
        base = load_causal_lm(adapter_base(path), dtype)
        return _loading(path, "LoRA adapter", lambda: load_adapter(base, path, trainable=False).merge_and_unload())
    return _loading(path, "model", lambda: AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype)).to(default_device()))


def load_reward_model(path: str, dtype: str = "float32"):
    """A sequence-scoring model. From a causal LM (the reward model's start, PPO's critic) its
    head is new: transformers' load report prints that as a MISSING table that reads like an
    error, so it is silenced here and said in one line instead."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = _loading(path, "reward model", lambda: AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=getattr(torch, dtype), output_loading_info=True))
    finally:
        hf_logging.set_verbosity(before)
    fresh = sorted(info.get("missing_keys") or [])
    if fresh:
        log.info("%s: a new scoring head (%s), as expected when starting from a causal LM", path, ", ".join(fresh))
    return model.to(default_device())
