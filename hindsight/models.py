"""Load policy, reference and reward models, and build the tiny demo model.

Every stage loads models through `load_causal_lm` / `load_reward_model`, so a hub id,
a local path and the demo model built here all take the same `from_pretrained` path.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from hindsight.errors import CheckpointError, ConfigError

DEMO_SPECIAL = {"pad": "<pad>", "eos": "<eos>", "bos": "<bos>", "unk": "<unk>"}

log = logging.getLogger("hindsight.models")


def build_demo_tokenizer():
    """A small byte-level BPE trained in code on the demo's vocabulary: no download.

    Byte-level means any text still encodes; digits are split one per token, so the answer
    to an arithmetic problem is a few tokens the policy must each get right.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from hindsight.data import NAMES, ITEMS, VERBS

    core = Tokenizer(models.BPE(unk_token=None))
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    core.decoder = decoders.ByteLevel()
    words = NAMES + ITEMS + VERBS + ["has", "and", "more", "How", "many", "now", "A", "Q"]
    corpus = [" ".join(words)] * 4 + [f"{w} {w}." for w in words]
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=list(DEMO_SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=DEMO_SPECIAL["pad"],
        eos_token=DEMO_SPECIAL["eos"],
        bos_token=DEMO_SPECIAL["bos"],
        unk_token=DEMO_SPECIAL["unk"],
    )


def build_tiny_model(out_dir: str | Path, hidden: int = 128, layers: int = 4, heads: int = 4,
                     seed: int = 0) -> Path:
    """Write a randomly initialised Llama-style causal LM plus tokenizer in HF format."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tok = build_demo_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 4,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=256, tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    os.replace(tmp, out_dir) if not out_dir.exists() else None
    return out_dir


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
    """`tiny://demo` builds (once) the demo model; a local path must exist; a hub id passes."""
    if name_or_path.startswith("tiny://"):
        target = Path(cache_dir) / name_or_path.removeprefix("tiny://")
        if not target.exists():
            build_tiny_model(target)
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

    from hindsight.lora import adapter_base, is_adapter_dir, load_adapter

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
