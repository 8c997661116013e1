"""Every tracking write of a run goes through `write`: sent, or spooled in the run directory while
the server is unreachable, and replayed (`sync_spool`) once a later write gets through."""
from __future__ import annotations

from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from hindsight.config import PipelineConfig
from tracking.spool import OUTAGE, Spool, unreachable
from tracking.store import client_for, tracking_uri


def write(cfg: PipelineConfig, run_id: str, op: str, send, **payload):
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
        return register_version(c, run_id, op["local_dir"], op["model_name"], tuple(op["aliases"]), op.get("tags"))
    elif kind == "terminate":
        c.set_terminated(run_id, status=op["status"])
    else:
        raise ValueError(f"unknown spooled operation {kind!r}")


def register_version(c: MlflowClient, run_id: str, local_dir: str | Path, model_name: str, aliases: tuple[str, ...],
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
