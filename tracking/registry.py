"""The MLflow model registry: a stage's checkpoint folder registered as a version, and a
`models:/NAME@ALIAS` (or a path, `tiny://`, a hub id) resolved to a local folder."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import mlflow
from mlflow.exceptions import MlflowException

from hindsight.config import PipelineConfig
from hindsight.errors import ConfigError
from hindsight.models.source import resolve_model_source
from tracking.store import client
from tracking.writes import file_checksums, register_version, write


def register(cfg: PipelineConfig, run_id: str, local_dir: str | Path, model_name: str,
             aliases: tuple[str, ...] = (), tags: dict | None = None) -> str:
    """Log a checkpoint folder as run artifacts and register it; returns the version.

    MLflow reserves `@latest` and resolves it to the newest version itself, so `X@latest`
    always means the version registered last.
    """
    tags = dict(tags or {})
    version = write(cfg, run_id, "register", lambda: register_version(client(cfg), run_id, local_dir, model_name, aliases, tags),
                     local_dir=str(Path(local_dir).resolve()), model_name=model_name, aliases=list(aliases), tags=tags,
                     files=file_checksums(local_dir))  # spooled: what a replay must find there
    return SPOOLED if version is None else version


SPOOLED = "spooled"  # the version of a registration waiting in the spool


def withdraw(cfg: PipelineConfig, model_name: str, version: str) -> None:
    """Delete a version registered by a run that then failed: MLflow resolves `@latest` to the
    newest version, so deleting it moves `@latest` back to the version before."""
    if version == SPOOLED:
        return
    try:
        client(cfg).delete_model_version(model_name, version)
    except MlflowException:  # already gone, or the server went down: the FAILED run's tag says why
        pass


def resolve_model(cfg: PipelineConfig, uri: str, field: str) -> tuple[str, str]:
    """`models:/NAME@ALIAS` or `models:/NAME/VERSION` -> (local folder, 'NAME/VERSION').

    A local path, `tiny://`, a `.gguf` file or a hub id resolves through `resolve_model_source`
    (a GGUF's version is its sha256, any other's is the uri itself). `field` is the config key
    the uri came from, for error messages.
    """
    if not uri.startswith("models:/"):  # a GGUF is imported once into a cache folder, versioned by its sha256
        return resolve_model_source(uri, field=field)
    c = client(cfg)
    body = uri.removeprefix("models:/")
    try:
        if "@" in body:
            name, alias = body.split("@", 1)
            mv = c.get_model_version_by_alias(name, alias)
        else:
            name, version = body.rsplit("/", 1)
            mv = c.get_model_version(name, version)
    except MlflowException as exc:
        raise ConfigError(f"{field}: {uri} not found in the model registry at {c.tracking_uri} "
                             f"({exc.message.splitlines()[0]}); run the stage that produces it first") from None
    # keyed by where the version's files are stored as well as by its number: another tracking store
    # (a new mlflow.db in the same folder) numbers its own versions from 1 again, and must not be
    # handed the first store's weights for them
    where = hashlib.sha256(str(mv.source).encode()).hexdigest()[:12]
    dst = Path(".hindsight") / "registry" / mv.name / f"{mv.version}-{where}"
    if not ((dst / "config.json").exists() or (dst / "adapter_config.json").exists()):
        dst.mkdir(parents=True, exist_ok=True)
        mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(dst))
        nested = dst / "checkpoint"
        if nested.is_dir():  # download keeps the last path component
            for p in nested.iterdir():
                p.rename(dst / p.name)
            nested.rmdir()
    _resolve_adapter_base(cfg, dst, field)
    return str(dst), f"{mv.name}/{mv.version}"


def base_reference(cfg: PipelineConfig, uri: str, local_path: str) -> str:
    """What an exported adapter names as its base, so that it resolves from anywhere: a registry
    version as `models:/NAME/VERSION` (not `@latest`, which moves), a local or built-in model
    as its absolute path, a hub id as it is."""
    if uri.startswith("models:/"):
        return "models:/" + resolve_model(cfg, uri, "rl.init")[1]
    if uri.startswith("tiny://") or Path(local_path).exists():
        return str(Path(local_path).resolve())
    return uri


def _resolve_adapter_base(cfg: PipelineConfig, folder: Path, field: str) -> None:
    """A downloaded adapter whose base is a registry URI gets that base downloaded too, and its
    local copy points at it, so `load_causal_lm` (which knows no registry) can load it."""
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        return
    config = json.loads(config_file.read_text())
    base = config.get("base_model_name_or_path", "")
    if base.startswith("models:/"):
        config["base_model_name_or_path"] = str(Path(resolve_model(cfg, base, field)[0]).resolve())
        config_file.write_text(json.dumps(config, indent=2, sort_keys=True))
