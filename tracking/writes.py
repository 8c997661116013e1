"""Every tracking write of a run goes through `write`: sent, or spooled in the run directory while
the server is unreachable, and replayed (`sync_spool`) once a later write gets through."""
from __future__ import annotations

import logging
import os
from pathlib import Path

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from hindsight.config import PipelineConfig
from hindsight.errors import TrackingError
from hindsight.fsutil import file_sha256
from tracking.spool import OUTAGE, Spool, unreachable
from tracking.store import client_for, tracking_uri

log = logging.getLogger("hindsight.tracking")


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
            sync_spool(cfg.root, uri)
        except Exception as exc:  # down again: what is left stays spooled
            if not unreachable(exc):
                raise
            OUTAGE.went_down(uri, spool, exc)
    return result


class SpoolError(TrackingError):
    """A spooled operation that is malformed, or would do what its run never could."""


def sync_spool(run_dir: str | Path, uri: str) -> int:
    """Send what a run spooled during an outage to the store at `uri` (the configured one, never
    one read from the spool); returns how many writes went out. Each operation is checked first
    (`SpoolCheck`): the spool is replayed, never obeyed. MLflow refusing one is one error naming
    its line."""
    check = SpoolCheck(client_for(uri), Path(run_dir))

    def apply(op: dict):
        try:
            return _apply(check.client, op)
        except MlflowException as exc:
            first = (str(exc.message if hasattr(exc, "message") else exc).strip().splitlines() or [""])[0][:300]
            raise SpoolError(f"{check.where}: MLflow refused the spooled {op['op']!r}: {first}") from None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:  # a record of a spooled trace without its fields
            raise SpoolError(f"{check.where}: the spooled {op['op']!r} is malformed ({type(exc).__name__}: "
                             f"{str(exc)[:200]})") from None

    return Spool(run_dir).replay(apply, check)


class SpoolCheck:
    """What a spooled operation may do: touch only runs this run directory started (their
    `hindsight.run_dir` tag, set when the run was created on the server), register only the model
    its run's stage registers (`hindsight.model`), from a folder whose files are the ones the run
    wrote (their sha256, recorded when the registration was spooled), and read only files inside
    the run directory, through no symlink at any level. A spool never sets a `hindsight.` tag:
    those say which run directory and model a run belongs to, so they are left out of a replayed
    `tags` op (with one warning line)."""

    def __init__(self, c: MlflowClient, run_dir: Path):
        self.client, self.root = c, run_dir.resolve()
        self._runs: dict[str, dict] = {}
        self.where = ""

    def __call__(self, op, where: str) -> None:
        self.where = where
        if not isinstance(op, dict) or op.get("op") not in _FIELDS:
            raise SpoolError(f"{where}: not a spooled operation ({str(op)[:80]!r})")
        missing = [k for k, kind in _FIELDS[op["op"]].items() if not isinstance(op.get(k), kind)]
        if missing or not isinstance(op.get("run_id"), str):
            raise SpoolError(f"{where}: spooled {op['op']!r} lacks or mistypes {sorted(missing) or ['run_id']}")
        tags = self._tags(op["run_id"], where)
        if tags.get("hindsight.run_dir") != str(self.root):
            raise SpoolError(f"{where}: run {op['run_id']} was not started by {self.root}; refusing to write to it")
        for key in ("path", "local_dir"):
            if key in op:
                inside(op[key], self.root, f"{where}: {key}")
        if op["op"] == "register":
            if op["model_name"] != tags.get("hindsight.model"):
                raise SpoolError(f"{where}: run {op['run_id']} registers {tags.get('hindsight.model')!r}, not "
                                 f"{op['model_name']!r}")
            same_files(op, where)
        if op["op"] == "tags":
            kept = {k: v for k, v in op["tags"].items() if not str(k).startswith("hindsight.")}
            if len(kept) < len(op["tags"]):
                log.warning("%s: a spool never sets hindsight.* tags; left out: %s", where,
                            ", ".join(sorted(k for k in op["tags"] if k not in kept)))
                op["tags"] = kept

    def _tags(self, run_id: str, where: str) -> dict:
        if run_id not in self._runs:
            try:
                self._runs[run_id] = self.client.get_run(run_id).data.tags
            except MlflowException:
                raise SpoolError(f"{where}: run {run_id} is not in the store at {self.client.tracking_uri}") from None
        return self._runs[run_id]


def inside(path: str, root: Path, what: str) -> Path:
    """`path` when it lies in `root` through real folders only: every component is resolved, and
    a symlink anywhere (in the path, or inside a folder it names) is refused."""
    p = Path(path)
    if not p.is_absolute() or ".." in p.parts:
        raise SpoolError(f"{what} {path} is not an absolute path inside the run directory {root}")
    for level in [p, *p.parents]:
        if level.is_symlink():
            raise SpoolError(f"{what} {path}: {level} is a symlink; refused")
    if not Path(os.path.realpath(p)).is_relative_to(root):
        raise SpoolError(f"{what} {path} is outside the run directory {root}")
    if p.is_dir():
        for dirpath, dirnames, filenames in os.walk(p):
            for name in dirnames + filenames:
                if Path(dirpath, name).is_symlink():
                    raise SpoolError(f"{what} {path}: {Path(dirpath, name)} is a symlink; refused")
    return p


def file_checksums(folder: str | Path) -> dict[str, str]:
    """sha256 of every file under `folder`, by its path relative to it."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): file_sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def same_files(op: dict, where: str) -> None:
    """A registration replays the folder the run wrote: the same files with the same sha256."""
    recorded = op.get("files")
    if not isinstance(recorded, dict) or not recorded:
        raise SpoolError(f"{where}: the spooled registration records no checksums of {op['local_dir']}; refused")
    now = file_checksums(op["local_dir"])
    if now != recorded:
        changed = sorted(set(now) ^ set(recorded) | {k for k in now.keys() & recorded.keys() if now[k] != recorded[k]})
        raise SpoolError(f"{where}: {op['local_dir']} is not the folder the run registered ({', '.join(changed[:5])} "
                         f"differ from their recorded sha256); refused")


_FIELDS = {"metrics": {"metrics": list}, "tags": {"tags": dict}, "params": {"params": dict},
           "artifact": {"path": str}, "text": {"text": str, "artifact_file": str},
           "register": {"local_dir": str, "model_name": str, "aliases": list},
           "terminate": {"status": str}, "traces": {"records": list}}


def _apply(c: MlflowClient, op: dict):
    run_id, kind = op["run_id"], op["op"]
    if kind == "metrics":
        c.log_batch(run_id, metrics=[Metric(k, v, ts, step) for k, v, ts, step in op["metrics"]])
    elif kind == "tags":
        c.log_batch(run_id, tags=[RunTag(k, v) for k, v in op["tags"].items()])
    elif kind == "params":
        c.log_batch(run_id, params=[Param(k, v) for k, v in op["params"].items()])
    elif kind == "artifact":
        (c.log_artifacts if Path(op["path"]).is_dir() else c.log_artifact)(run_id, op["path"], op.get("artifact_path"))
    elif kind == "text":
        c.log_text(run_id, op["text"], op["artifact_file"])
    elif kind == "register":
        return register_version(c, run_id, op["local_dir"], op["model_name"], tuple(op["aliases"]), op.get("tags"))
    elif kind == "terminate":
        c.set_terminated(run_id, status=op["status"])
    elif kind == "traces":
        from tracking.trace_send import send_records

        send_records(c.tracking_uri, run_id, op["records"], c.get_run(run_id).info.experiment_id)


def register_version(c: MlflowClient, run_id: str, local_dir: str | Path, model_name: str, aliases: tuple[str, ...],
              tags: dict | None = None) -> str:
    """One version per run: a replay after a sync killed once the version existed finds it again."""
    try:
        existing = c.search_model_versions(f"name='{model_name}' and run_id='{run_id}'")
    except MlflowException:
        existing = []
    if existing:
        return str(existing[0].version)
    c.log_artifacts(run_id, str(local_dir), artifact_path="checkpoint")
    source = f"{c.get_run(run_id).info.artifact_uri}/checkpoint"
    try:
        c.get_registered_model(model_name)
    except MlflowException:
        c.create_registered_model(model_name)
    mv = c.create_model_version(model_name, source, run_id=run_id, tags=tags or None)
    for alias in aliases:
        c.set_registered_model_alias(model_name, alias, mv.version)
    return str(mv.version)
