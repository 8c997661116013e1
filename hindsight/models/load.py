"""Load policy, reference and reward models (a hub id, a local path or a `tiny://` model).

Every stage loads models through `load_causal_lm` / `load_reward_model`, so a hub id,
a local path and the demo model (`models.tiny`) all take the same `from_pretrained` path.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from hindsight.errors import CheckpointError

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


from hindsight.models.source import MODEL_CACHE, resolve_model_path, resolve_model_source  # noqa: E402,F401


def _loading(path: str, what: str, load):
    """from_pretrained fails in many ways (missing files, truncated safetensors, offline hub);
    each becomes one error naming the path."""
    from hindsight.progress import working

    try:
        with working(f"loading {what} from {path}"):  # a 7B model's load takes minutes: say it is alive
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


def load_causal_lm(path: str, dtype: str = "float32", empty: bool = False):
    """A causal LM; a LoRA adapter folder (an RL policy trained with `rl.lora`) loads on its base
    and is merged, so it evaluates and fine-tunes like any model. `empty`: built from its config
    with its parameters on the meta device (`empty_model`)."""
    from transformers import AutoModelForCausalLM

    from hindsight.models.lora import adapter_base, is_adapter_dir, load_adapter
    from hindsight.models.savable import require_savable

    if empty:
        return empty_model(AutoModelForCausalLM, path, dtype)
    if is_adapter_dir(path):
        base = load_causal_lm(adapter_base(path), dtype)
        return _loading(path, "LoRA adapter", lambda: load_adapter(base, path, trainable=False).merge_and_unload())
    model = _loading(path, "model", lambda: AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype)).to(default_device()))
    require_savable(model, path)
    return model


def load_reward_model(path: str, dtype: str = "float32", empty: bool = False):
    """A sequence-scoring model. From a causal LM (the reward model's start, PPO's critic) its
    head is new: transformers' load report prints that as a MISSING table that reads like an
    error, so it is silenced here and said in one line instead. The names no checkpoint file
    held are kept on the model (`missing_names`)."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    if empty:
        model = empty_model(AutoModelForSequenceClassification, path, dtype, num_labels=1)
        held = weight_files(path)
        setattr(model, MISSING, sorted(name for name, _ in model.named_parameters() if name not in held))
        return model
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
    setattr(model, MISSING, fresh)
    from hindsight.models.savable import require_savable

    require_savable(model, path)
    return model.to(default_device())


MISSING = "_hindsight_missing"  # parameter names no checkpoint file held (a new head)
FRESH = "_hindsight_fresh"      # their seeded starting values, kept for a model built on the meta device


def missing_names(model) -> list[str]:
    return list(getattr(model, MISSING, None) or [])


def empty_model(auto_cls, path: str, dtype: str, **kwargs):
    """The model `path`'s config builds, its parameters on the meta device (no memory) and its
    buffers computed for real (rotary frequencies are in no checkpoint); tied weights tied, as
    `from_pretrained` ties them."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    config = _loading(path, "model config", lambda: AutoConfig.from_pretrained(path, **kwargs))
    with init_empty_weights(include_buffers=False):
        model = auto_cls.from_config(config, dtype=getattr(torch, dtype))
    model.tie_weights()  # the empty init gives each tied weight a parameter of its own
    return model


def fresh_values(model, names: list[str], seed: int) -> dict[str, torch.Tensor]:
    """Starting values for parameters no checkpoint holds (a new value head): normal(0,
    initializer_range) for weights and zeros for biases, drawn on the CPU from (seed, name). They
    do not depend on how the model was built, so every learner strategy and rank starts the head
    the same."""
    import zlib

    std = float(getattr(model.config, "initializer_range", 0.02))
    params = dict(model.named_parameters())
    out = {}
    for name in sorted(names):
        shape = params[name].shape
        if name.endswith("bias"):
            out[name] = torch.zeros(shape)
            continue
        gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
        out[name] = torch.empty(shape).normal_(0.0, std, generator=gen)
    return out


def weight_files(folder: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file of a model folder that holds it (one file, or the
    index of several); empty when the folder has no safetensors."""
    import json

    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return {name: folder / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if len(files) != 1:
        return {}
    from safetensors import safe_open

    with safe_open(str(files[0]), framework="pt") as f:
        return {name: files[0] for name in f.keys()}
