"""A trained policy as one folder that loads from anywhere: a LoRA adapter merged into its base,
or the adapter with its base named by a reference that resolves."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.lora import ADAPTER_CONFIG


def export_merged(adapter_dir, out_dir) -> Path:
    """The adapter merged into its base, saved as one plain Hugging Face folder (weights, config,
    generation config, tokenizer with its chat template) that loads without peft from anywhere."""
    out, tmp = Path(out_dir), Path(str(out_dir) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    load_causal_lm(str(adapter_dir)).save_pretrained(tmp, safe_serialization=True)
    load_tokenizer(str(adapter_dir)).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def export_adapter(adapter_dir, out_dir, base_ref: str) -> Path:
    """The adapter folder with its base named by `base_ref` (a hub id, an absolute path or a
    `models:/NAME/VERSION` URI) instead of the relative cache folder it was trained from."""
    out, tmp = Path(out_dir), Path(str(out_dir) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(adapter_dir, tmp)
    config = json.loads((tmp / ADAPTER_CONFIG).read_text())
    config["base_model_name_or_path"] = base_ref
    (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
