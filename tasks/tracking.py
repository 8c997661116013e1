"""MLflow through an explicit client and run ids.

Explicit ids (not mlflow's thread-local active run) keep nested stage runs correct when
Prefect runs tasks in worker threads. Every write of a run goes through `_write`, which
spools it in the run directory while the server is unreachable (tasks/spool.py).
"""
from __future__ import annotations

import atexit
import os
from concurrent.futures import ThreadPoolExecutor
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
from hindsight.models.load import resolve_model_path
from tasks.spool import OUTAGE, Spool, unreachable

# MLflow's defaults retry a dead server for minutes (7 retries, backoff 2, 120 s timeout); a
# run that spools instead only needs to learn quickly that it is down. A user's setting wins.
for _var, _value in (("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"), ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"),
                     ("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")):
    os.environ.setdefault(_var, _value)


def tracking_uri(cfg: PipelineConfig) -> str:
    return cfg.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def client(cfg: PipelineConfig) -> MlflowClient:
    return client_for(tracking_uri(cfg))


def client_for(uri: str) -> MlflowClient:
    mlflow.set_tracking_uri(uri)  # also for mlflow's own helpers that read the global URI
    mlflow.set_registry_uri(uri)
    if uri not in _CLIENTS:  # one per store and process: a new client per call cost ~10 ms a step
        require_reachable(uri)
        with _one_opener(uri):
            _CLIENTS[uri] = MlflowClient(uri, registry_uri=uri)  # opens the tracking store: creates its tables
    return _CLIENTS[uri]


@contextmanager
def _one_opener(uri: str):
    """Open a SQLite store one process at a time. MLflow creates a new database's tables and runs
    its migrations when a store is opened; two commands opening a new one at once (two
    pipelines started together) raced: `table metrics already exists`, or alembic's
    `Online migration expected to match one row`, and one command failed. A database server
    orders this itself, so only `sqlite:` is locked (a lock file beside the database)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(uri.removeprefix("sqlite:///").split("?", 1)[0])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".open-lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when the process dies
        yield


def require_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """A tracking server that cannot be reached when a command starts is one clear error within
    seconds, not minutes of retries (a database or file store needs no server)."""
    if not uri.startswith(("http://", "https://")):
        return
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
    except requests.RequestException as exc:
        reason = str(exc).split("(Caused by ")[-1].rstrip(")")[:200]
        raise ConfigError(f"tracking: the MLflow server at {uri} cannot be reached ({reason}); start it, or point "
                          f"tracking.tracking_uri / MLFLOW_TRACKING_URI at one that runs") from None


_CLIENTS: dict[str, MlflowClient] = {}


# How MLflow 3.17's web app decides an experiment's kind: from the app-wide "workflow type"
# (GenAI or model training; browser local storage `mlflow.workflowType`, default GenAI),
# overridden by the `workflowType` URL parameter. Its per-experiment tag
# `mlflow.experimentKind` is read only when that switch is off (never, in 3.17). So the
# experiment carries the tag (for the versions that read it) and every link hindsight prints
# carries `?workflowType=machine_learning` (`ui_url`): the Runs table, not a Traces overview.
EXPERIMENT_KIND = {"mlflow.experimentKind": "finetuning"}
TRAINING_VIEW = "workflowType=machine_learning"


def ui_url(server: str, experiment_id: str | None = None, model: str | None = None) -> str:
    """A link into the MLflow UI that opens in its model-training view."""
    route = f"models/{model}" if model else f"experiments/{experiment_id}"
    return f"{server.rstrip('/')}/#/{route}?{TRAINING_VIEW}"


def experiment_id(c: MlflowClient, cfg: PipelineConfig) -> str:
    exp = c.get_experiment_by_name(cfg.tracking.experiment)
    if exp is not None:
        if "mlflow.experimentKind" not in exp.tags:  # made by an older hindsight, or by hand
            c.set_experiment_tag(exp.experiment_id, "mlflow.experimentKind", EXPERIMENT_KIND["mlflow.experimentKind"])
        return exp.experiment_id
    location = None
    if c.tracking_uri.startswith("sqlite:"):  # keep artifacts beside the embedded store
        location = (Path.cwd() / "mlartifacts").as_uri()
    return c.create_experiment(cfg.tracking.experiment, artifact_location=location, tags=EXPERIMENT_KIND)


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
    _ACTIVE[run.info.run_id] = cfg
    return run.info.run_id


_ACTIVE: dict[str, PipelineConfig] = {}  # runs this process started and has not ended


@atexit.register
def _end_leftover_runs() -> None:
    """A process that ends (an uncaught error, Ctrl-C) never leaves its runs RUNNING."""
    for run_id, cfg in list(_ACTIVE.items()):
        try:
            end_run(cfg, run_id, "FAILED")
        except Exception:  # at exit: nothing left to report to
            pass


def _write(cfg: PipelineConfig, run_id: str, op: str, send, **payload):
    """Send one tracking write, or spool it (returning None) while the server is unreachable."""
    uri, spool = tracking_uri(cfg), Spool(cfg.root)
    if OUTAGE.offline(uri):
        spool.add(op, uri, run_id, **payload)
        return None
    try:
        result = send()
    except Exception as exc:
        if not unreachable(exc):
            raise
        OUTAGE.went_down(uri, spool, exc)
        spool.add(op, uri, run_id, **payload)
        return None
    if OUTAGE.came_back(uri):
        try:
            sync_spool(cfg.root)
        except Exception as exc:  # down again: what is left stays spooled
            if not unreachable(exc):
                raise
            OUTAGE.went_down(uri, spool, exc)
    return result


def sync_spool(run_dir: str | Path) -> int:
    """Send what a run spooled during an outage; returns how many writes went out."""
    return Spool(run_dir).replay(_apply)


def _apply(op: dict):
    c, run_id = client_for(op["uri"]), op["run_id"]
    kind = op["op"]
    if kind == "metrics":
        c.log_batch(run_id, metrics=[Metric(k, v, ts, step) for k, v, ts, step in op["metrics"]])
    elif kind == "tags":
        c.log_batch(run_id, tags=[RunTag(k, v) for k, v in op["tags"].items()])
    elif kind == "params":
        c.log_batch(run_id, params=[Param(k, v) for k, v in op["params"].items()])
    elif kind == "artifact":
        (c.log_artifacts if Path(op["path"]).is_dir() else c.log_artifact)(run_id, op["path"], op["artifact_path"])
    elif kind == "text":
        c.log_text(run_id, op["text"], op["artifact_file"])
    elif kind == "register":
        return _register(c, run_id, op["local_dir"], op["model_name"], tuple(op["aliases"]), op.get("tags"))
    elif kind == "terminate":
        c.set_terminated(run_id, status=op["status"])
    else:
        raise ValueError(f"unknown spooled operation {kind!r}")


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
    from importlib.metadata import version

    c = client(cfg)
    params = {k: v[:6000] for k, v in flatten(cfg).items()}
    keys = list(params)
    for i in range(0, len(keys), 100):
        chunk = {k: params[k] for k in keys[i:i + 100]}
        _write(cfg, run_id, "params", lambda chunk=chunk: c.log_batch(run_id, params=[Param(k, v) for k, v in chunk.items()]),
               params=chunk)
    set_tags(cfg, run_id, {"data.md5": data_md5 or "unknown", "git.commit": git_commit(),
                           "version.torch": version("torch"), "version.transformers": version("transformers"),
                           "version.trl": version("trl"), "version.python": sys.version.split()[0]})


_PENDING: list = []  # metric writes handed to the writer thread, not yet confirmed written
# One writer thread of our own, not MLflow's async logging: MLflow's logger polls its queue with
# a 1 s timeout, so each run's end (`set_terminated` shuts it down) and the process's exit
# waited up to a second for it, and its buffered mode deadlocks in 3.17. One worker keeps the
# writes in order; the executor's own exit hook drains it, so no metric is lost at exit.
_WRITER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hindsight-metrics")


def log_metrics(cfg: PipelineConfig, run_id: str, metrics: dict[str, float], step: int) -> None:
    """Queue the step's metrics: the training loop does not wait for the tracking store.
    `flush_metrics` waits for them; `end_run` calls it, so a run never ends with a metric
    missing, and a write that failed raises there."""
    import time

    now = int(time.time() * 1000)
    batch = [Metric(_metric_key(k), float(v), now, step) for k, v in metrics.items() if v is not None]
    if not batch:
        return
    rows = [[m.key, m.value, m.timestamp, m.step] for m in batch]
    op = _write(cfg, run_id, "metrics", lambda: _WRITER.submit(client(cfg).log_batch, run_id, metrics=batch),
                metrics=rows)
    if op is not None:
        _PENDING.append((op, cfg, run_id, rows))


def flush_metrics() -> None:
    """Wait for the queued metric writes; those the server never got (it went down) are spooled."""
    while _PENDING:
        op, cfg, run_id, rows = _PENDING.pop(0)
        try:
            op.result()
        except Exception as exc:
            if not unreachable(exc):
                raise
            uri = tracking_uri(cfg)
            OUTAGE.went_down(uri, Spool(cfg.root), exc)
            Spool(cfg.root).add("metrics", uri, run_id, metrics=rows)


def _metric_key(key: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in key)


def set_tags(cfg: PipelineConfig, run_id: str, tags: dict[str, str]) -> None:
    tags = {k: str(v) for k, v in tags.items()}
    _write(cfg, run_id, "tags", lambda: client(cfg).log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()]),
           tags=tags)


def log_json(cfg: PipelineConfig, run_id: str, obj, artifact_file: str) -> None:
    import json

    text = json.dumps(obj, indent=1)
    _write(cfg, run_id, "text", lambda: client(cfg).log_text(run_id, text, artifact_file), text=text,
           artifact_file=artifact_file)


def log_artifact(cfg: PipelineConfig, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
    _write(cfg, run_id, "artifact", lambda: client(cfg).log_artifact(run_id, str(path), artifact_path), path=str(path),
           artifact_path=artifact_path)


def end_run(cfg: PipelineConfig, run_id: str, status: str = "FINISHED") -> None:
    _ACTIVE.pop(run_id, None)
    try:
        flush_metrics()
    finally:  # a failed flush still ends the run, and then raises
        _write(cfg, run_id, "terminate", lambda: client(cfg).set_terminated(run_id, status=status), status=status)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def register(cfg: PipelineConfig, run_id: str, local_dir: str | Path, model_name: str,
             aliases: tuple[str, ...] = (), tags: dict | None = None) -> str:
    """Log a checkpoint folder as run artifacts and register it; returns the version.

    MLflow reserves `@latest` and resolves it to the newest version itself, so `X@latest`
    always means the version registered last.
    """
    tags = dict(tags or {})
    version = _write(cfg, run_id, "register", lambda: _register(client(cfg), run_id, local_dir, model_name, aliases, tags),
                     local_dir=str(local_dir), model_name=model_name, aliases=list(aliases), tags=tags)
    return SPOOLED if version is None else version


SPOOLED = "spooled"  # the version of a registration waiting in the spool


def _register(c: MlflowClient, run_id: str, local_dir: str | Path, model_name: str, aliases: tuple[str, ...],
              tags: dict | None = None) -> str:
    c.log_artifacts(run_id, str(local_dir), artifact_path="checkpoint")
    source = f"{c.get_run(run_id).info.artifact_uri}/checkpoint"
    try:
        c.get_registered_model(model_name)
    except MlflowException:
        c.create_registered_model(model_name)
    mv = c.create_model_version(model_name, source, run_id=run_id, tags=tags or None)
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
