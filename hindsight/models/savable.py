"""A stage proves, before step 1, that what it trains can be written as a checkpoint.

The reported failure: a model folder whose config still carried a GGUF `quantization_config`
trained 4 RL steps, then failed its first checkpoint ("quantized with gguf and is not
serializable"), and the retry began again from step 0. Minutes too late. The checks here read
the config, not the weights; the config and generation config are saved
once into a temporary folder, as every checkpoint saves them (a generation config that
transformers refuses to write, such as `num_return_sequences: 3` without sampling, loads fine
and fails only there). A passed probe is remembered by the files' bytes, since loading a config
imports seconds of transformers. `require_savable` is the same refusal for a model already loaded.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hindsight.errors import ConfigError

IMPORT_HINT = "a GGUF file is imported into a full-precision folder: `hindsight model import SRC OUT`"


def quantized_entry(path: str | Path) -> str | None:
    """The quantization a model folder's config.json declares (`quantization_config`), or None."""
    try:
        data = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    quant = data.get("quantization_config") if isinstance(data, dict) else None
    if not quant:
        return None
    return str(quant.get("quant_method", "?")) if isinstance(quant, dict) else "?"


def check_model_folder(path: str | Path, field: str) -> None:
    """One error, naming the field and the key, for a folder hindsight could load but not save."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        return  # a hub id, or a LoRA adapter folder (its base is checked as its own field)
    method = quantized_entry(folder)
    if method:
        raise ConfigError(f"{field}: {folder / 'config.json'}: quantization_config ({method}) is refused: hindsight "
                          f"trains and saves full-precision weights, and a quantized model cannot be checkpointed; "
                          f"remove the key from a folder that already holds full-precision weights, or re-import it "
                          f"({IMPORT_HINT})")
    _probe_save(folder, field)


def _probe_save(folder: Path, field: str) -> None:
    passed = _probe_record(folder)
    if passed.exists():  # these same files passed under this transformers: a cached rerun pays nothing
        return
    from transformers import AutoConfig, GenerationConfig

    with tempfile.TemporaryDirectory(prefix="hindsight-save-probe-") as tmp:
        for name, load in (("config.json", AutoConfig.from_pretrained),
                           ("generation_config.json", GenerationConfig.from_pretrained)):
            if not (folder / name).is_file():
                continue
            try:
                load(str(folder)).save_pretrained(tmp)
            except Exception as exc:  # transformers validates what it writes: the first checkpoint would fail
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                raise ConfigError(f"{field}: {folder / name}: the model cannot be saved, so no checkpoint of it "
                                  f"could be written ({type(exc).__name__}: {first}); fix that file") from None
    try:
        passed.parent.mkdir(parents=True, exist_ok=True)
        passed.touch()
    except OSError:
        pass  # a read-only working directory: the probe runs again next time


def _probe_record(folder: Path) -> Path:
    """The marker of a passed probe: named by the two files' bytes and transformers' version
    (the probe loads the config, which is seconds of transformers' imports, then saves it)."""
    import hashlib
    from importlib.metadata import version

    h = hashlib.sha256(version("transformers").encode())
    for name in ("config.json", "generation_config.json"):
        file = folder / name
        h.update(name.encode() + (file.read_bytes() if file.is_file() else b"-"))
    return save_probes() / h.hexdigest()


def save_probes() -> Path:
    """The user's cache, not the working directory: a refused command leaves nothing in a run's folder."""
    import os

    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hindsight" / "save-probes"


def require_savable(model, where: str) -> None:
    """The refusal `save_pretrained` would give at the first checkpoint, given when the model loads."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and not getattr(quantizer, "is_serializable", lambda: True)():
        raise ConfigError(f"{where}: the model is loaded with a {type(quantizer).__name__} that cannot be saved, so "
                          f"no checkpoint of it could be written; give a full-precision folder ({IMPORT_HINT})")
