"""The MLflow tracking store: its URI, one client per store and process, the experiment, and links
into its UI. Opening a new SQLite store is one process at a time."""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import mlflow
from mlflow.tracking import MlflowClient

from hindsight.config import PipelineConfig
from hindsight.errors import ConfigError

# MLflow's defaults retry a dead server for minutes (7 retries, backoff 2, 120 s timeout); a
# run that spools instead only needs to learn quickly that it is down. A user's setting wins.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def tracking_uri(cfg: PipelineConfig) -> str:
    return cfg.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or \
        f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def client(cfg: PipelineConfig) -> MlflowClient:
    return client_for(tracking_uri(cfg))


def client_for(uri: str) -> MlflowClient:
    mlflow.set_tracking_uri(uri)  # also for mlflow's own helpers that read the global URI
    mlflow.set_registry_uri(uri)
    if uri not in _CLIENTS:  # one per store and process: a new client per call cost ~10 ms a step
        for var, value in HTTP_DEFAULTS.items():  # read by MLflow at each request, so set before the first
            os.environ.setdefault(var, value)
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

    # (connect, read): a server that takes the connection is up; a busy one (an auth server
    # hashing its first password on a loaded machine) gets a minute to answer, not five seconds
    timeout = (timeout_s, max(timeout_s, 60.0))
    try:
        requests.get(uri.rstrip("/") + "/health", timeout=timeout)
        user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
        probe = requests.get(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search", params={"max_results": 1},
                             auth=(user, password) if user else None, timeout=timeout)
    except requests.RequestException as exc:
        reason = str(exc).split("(Caused by ")[-1].rstrip(")")[:200]
        raise ConfigError(f"tracking: the MLflow server at {uri} cannot be reached ({reason}); start it, or point "
                          f"tracking.tracking_uri / MLFLOW_TRACKING_URI at one that runs") from None
    if probe.status_code in (401, 403):  # a server with auth (docs/deploy.md): say so once, not in a traceback
        given = "refused the credentials in MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD" if user else \
            "asks for credentials: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
        raise ConfigError(f"tracking: the MLflow server at {uri} {given} (HTTP {probe.status_code})")


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
