"""MLflow through an explicit client and run ids.

Explicit ids (not mlflow's thread-local active run) keep nested stage runs correct when
Prefect runs tasks in worker threads.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
import subprocess
import sys
from pathlib import Path

import mlflow
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from prefect.runtime import task_run as prefect_task_run

from hindsight.config import PipelineConfig, flatten
from hindsight.errors import AlertStop, ConfigError
from hindsight.models import resolve_model_path


def tracking_uri(cfg: PipelineConfig) -> str:
    return cfg.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def client(cfg: PipelineConfig) -> MlflowClient:
    uri = tracking_uri(cfg)
    mlflow.set_tracking_uri(uri)  # also for mlflow's own helpers that read the global URI
    mlflow.set_registry_uri(uri)
    if uri not in _CLIENTS:  # one per store and process: a new client per call cost ~10 ms a step
        _CLIENTS[uri] = MlflowClient(uri, registry_uri=uri)
    return _CLIENTS[uri]


_CLIENTS: dict[str, MlflowClient] = {}


def experiment_id(c: MlflowClient, cfg: PipelineConfig) -> str:
    exp = c.get_experiment_by_name(cfg.tracking.experiment)
    if exp is not None:
        return exp.experiment_id
    location = None
    if c.tracking_uri.startswith("sqlite:"):  # keep artifacts beside the embedded store
        location = (Path.cwd() / "mlartifacts").as_uri()
    return c.create_experiment(cfg.tracking.experiment, artifact_location=location)


def store_id(cfg: PipelineConfig) -> str:
    """The tracking store and when its experiment was created: changes if the store is recreated."""
    c = client(cfg)
    exp = c.get_experiment(experiment_id(c, cfg))
    return f"{c.tracking_uri}|{exp.experiment_id}|{exp.creation_time}"


def start_run(cfg: PipelineConfig, name: str, parent_run_id: str | None = None, tags: dict | None = None) -> str:
    c = client(cfg)
    all_tags = {"hindsight.stage": name, **(tags or {})}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    run = c.create_run(experiment_id(c, cfg), run_name=name, tags=all_tags)
    return run.info.run_id


@contextmanager
def stage_run(cfg: PipelineConfig, name: str, parent_run_id: str | None, tags: dict | None = None):
    """An MLflow run for one attempt of a stage task.

    Each Prefect attempt gets its own run tagged `hindsight.attempt`; a failed attempt ends
    FAILED with the cause in `hindsight.error`, so a retry is visible in the MLflow UI.
    """
    attempt = prefect_task_run.run_count or 1
    run_id = start_run(cfg, name, parent_run_id, {**(tags or {}), "hindsight.attempt": str(attempt)})
    try:
        yield run_id
    except AlertStop as exc:  # stopped on purpose, resumable: not a failure of the code
        set_tags(cfg, run_id, {"hindsight.stopped": str(exc)[:5000]})
        end_run(cfg, run_id, "KILLED")
        raise
    except BaseException as exc:
        set_tags(cfg, run_id, {"hindsight.error": f"{type(exc).__name__}: {exc}"[:5000]})
        end_run(cfg, run_id, "FAILED")
        raise


def log_context(cfg: PipelineConfig, run_id: str, data_md5: str | None) -> None:
    """Flattened config, data version, git commit and library versions."""
    import torch
    import transformers
    import trl

    c = client(cfg)
    params = [Param(k, v[:6000]) for k, v in flatten(cfg).items()]
    for i in range(0, len(params), 100):
        c.log_batch(run_id, params=params[i:i + 100])
    tags = {"data.md5": data_md5 or "unknown", "git.commit": git_commit(),
            "version.torch": torch.__version__, "version.transformers": transformers.__version__,
            "version.trl": trl.__version__, "version.python": sys.version.split()[0]}
    c.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])


_PENDING: list = []  # metric batches handed to MLflow's async logger, not yet confirmed written


def log_metrics(cfg: PipelineConfig, run_id: str, metrics: dict[str, float], step: int) -> None:
    """Queue the step's metrics (MLflow's async logging): the training loop does not wait for
    the tracking store. `flush_metrics` waits for them; `end_run` calls it, so a run never
    ends with a metric missing, and a write that failed raises there."""
    import time

    now = int(time.time() * 1000)
    batch = [Metric(_metric_key(k), float(v), now, step) for k, v in metrics.items() if v is not None]
    if batch:
        op = client(cfg).log_batch(run_id, metrics=batch, synchronous=False)
        if op is not None:
            _PENDING.append(op)


def flush_metrics() -> None:
    while _PENDING:
        _PENDING.pop(0).wait()


def _metric_key(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in key)


def set_tags(cfg: PipelineConfig, run_id: str, tags: dict[str, str]) -> None:
    client(cfg).log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def log_json(cfg: PipelineConfig, run_id: str, obj, artifact_file: str) -> None:
    import json

    client(cfg).log_text(run_id, json.dumps(obj, indent=1), artifact_file)


def log_artifact(cfg: PipelineConfig, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
    client(cfg).log_artifact(run_id, str(path), artifact_path)


def end_run(cfg: PipelineConfig, run_id: str, status: str = "FINISHED") -> None:
    try:
        flush_metrics()
    finally:  # a failed flush still ends the run, and then raises
        client(cfg).set_terminated(run_id, status=status)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def register(cfg: PipelineConfig, run_id: str, local_dir: str | Path, model_name: str,
             aliases: tuple[str, ...] = ()) -> str:
    """Log a checkpoint folder as run artifacts and register it; returns the version.

    MLflow reserves `@latest` and resolves it to the newest version itself, so `X@latest`
    always means the version registered last.
    """
    c = client(cfg)
    c.log_artifacts(run_id, str(local_dir), artifact_path="checkpoint")
    source = f"{c.get_run(run_id).info.artifact_uri}/checkpoint"
    try:
        c.get_registered_model(model_name)
    except MlflowException:
        c.create_registered_model(model_name)
    mv = c.create_model_version(model_name, source, run_id=run_id)
    for alias in aliases:
        c.set_registered_model_alias(model_name, alias, mv.version)
    return mv.version


def resolve_model(cfg: PipelineConfig, uri: str, field: str) -> tuple[str, str]:
    """`models:/NAME@ALIAS` or `models:/NAME/VERSION` -> (local folder, 'NAME/VERSION').

    A local path, `tiny://` or a hub id resolves through `resolve_model_path`, with itself
    as its version string. `field` is the config key the uri came from, for error messages.
    """
    if not uri.startswith("models:/"):
        return resolve_model_path(uri, field=field), uri
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
    dst = Path(".hindsight") / "registry" / mv.name / str(mv.version)
    if not (dst / "config.json").exists():
        dst.mkdir(parents=True, exist_ok=True)
        mlflow.artifacts.download_artifacts(artifact_uri=mv.source, dst_path=str(dst))
        nested = dst / "checkpoint"
        if nested.is_dir():  # download keeps the last path component
            for p in nested.iterdir():
                p.rename(dst / p.name)
            nested.rmdir()
    return str(dst), f"{mv.name}/{mv.version}"
