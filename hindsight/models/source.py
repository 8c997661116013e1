"""Where a model named in a config lives: `tiny://NAME` built once in code, a `.gguf` file
imported once into a plain folder, a local folder, or a hub id. Torch-free: the registry resolves
a stage's input models before the stage's cache is consulted, and a cached rerun loads nothing."""
from __future__ import annotations

from pathlib import Path

from hindsight.errors import ConfigError

MODEL_CACHE = ".hindsight/models"  # built-in tiny models and imported GGUF files, relative to the working directory


def resolve_model_path(name_or_path: str, cache_dir: str | Path = MODEL_CACHE, field: str = "model.base") -> str:
    """`tiny://demo` or `tiny://qwen2` builds (once) a tiny model in code; a `.gguf` file is
    imported (once) into a plain folder (`models.gguf`); a local path must exist; a hub id passes."""
    return resolve_model_source(name_or_path, cache_dir, field)[0]


def resolve_model_source(name_or_path: str, cache_dir: str | Path = MODEL_CACHE,
                         field: str = "model.base") -> tuple[str, str]:
    """(`resolve_model_path`'s folder, the version that names it): a GGUF file's is its sha256,
    anything else's is the name it was given."""
    if name_or_path.startswith("tiny://"):
        from hindsight.models.tiny import TINY

        name = name_or_path.removeprefix("tiny://")
        if name not in TINY:
            raise ConfigError(f"{field}: {name_or_path}: no such built-in model (tiny://{', tiny://'.join(TINY)})")
        target = Path(cache_dir) / name
        if not target.exists():
            _build_once(TINY[name], target)
        return str(target), name_or_path
    from hindsight.models.gguf import cached_import, is_gguf, package_file

    path = package_file(name_or_path, field)
    if is_gguf(path):
        return cached_import(path, cache_dir, field)
    looks_local = path.startswith((".", "/", "~")) or Path(path).exists()
    if looks_local and not Path(path).expanduser().is_dir():
        raise ConfigError(f"{field}: model path {path} does not exist (expected a model folder)")
    return path, name_or_path


def _build_once(build, target: Path) -> None:
    """Build into a folder of this process's and thread's own, then rename it into place: processes
    that resolve the same `tiny://` at once (a sweep's trials) never see or write a half-built folder."""
    import os
    import shutil

    from hindsight.fsutil import temporary_for

    tmp = temporary_for(target)
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    try:
        os.rename(tmp, target)
    except OSError:  # another process got there first: its folder is the same model
        shutil.rmtree(tmp, ignore_errors=True)
        if not target.is_dir():
            raise
