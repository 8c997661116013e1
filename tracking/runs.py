"""MLflow runs: one per stage attempt (nested under the pipeline's), its context (flattened config,
data version, git commit, library versions), tags, artifacts and its end. A process never leaves
a run it started RUNNING."""
from __future__ import annotations

import json

import atexit
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from mlflow.entities import Param, RunTag

from hindsight.config import PipelineConfig, flatten
from hindsight.errors import AlertStop, Preempted
from hindsight.state.rundir import RunDir
from hindsight.fsutil import atomic_write_json, read_json
from tracking.metrics import flush_metrics
from tracking.store import client, experiment_id
from tracking.writes import write


def start_run(cfg: PipelineConfig, name: str, parent_run_id: str | None = None, tags: dict | None = None,
              run_name: str | None = None) -> str:
    c = client(cfg)
    # the run directory that owns it: `hindsight sync` replays a spooled write only to runs it started
    all_tags = {"hindsight.stage": name, "hindsight.run_dir": str(cfg.root.resolve()), **(tags or {})}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    # "rl · myproj": a table of many projects' runs reads at a glance (the stage is also a tag)
    run = c.create_run(experiment_id(c, cfg), run_name=run_name or display_name(name, cfg.name),
                       tags=all_tags)
    if not _ACTIVE:  # registered with the first run, not at import
        atexit.register(_end_leftover_runs)
    _ACTIVE[run.info.run_id] = cfg
    _record_open(cfg, run.info.run_id, True)
    return run.info.run_id




def display_name(stage: str, project: str, model: str | None = None, version: str | None = None) -> str:
    """A run's name in MLflow: the stage and the config's name, and once registered what it made."""
    name = f"{stage} · {project}"
    return f"{name} → {model} v{version}" if model and version else name


def name_registered(cfg: PipelineConfig, run_id: str, stage: str, model: str, version: str) -> None:
    """Rename a stage's run after its model is registered: `rl · myproj → myproj-policy v3`."""
    set_tags(cfg, run_id, {"mlflow.runName": display_name(stage, cfg.name, model, version)})


def _record_open(cfg: PipelineConfig, run_id: str, is_open: bool) -> None:
    """Keep the run directory's list of its MLflow runs that are still open: a SIGKILLed process
    cannot end them, so the next start does (`end_orphaned_runs`)."""
    path = RunDir.of(cfg).open_runs
    runs = set(read_json(path) or []) if path.exists() else set()
    runs = runs | {run_id} if is_open else runs - {run_id}
    if runs:
        atomic_write_json(path, sorted(runs))
    else:  # none open: no file, so a finished run directory holds nothing of it
        path.unlink(missing_ok=True)


def end_orphaned_runs(cfg: PipelineConfig) -> list[str]:
    """End as KILLED the runs a killed process left RUNNING in this run directory (called at a
    stage's start, under the run lock, so none of them can still be live)."""
    path = RunDir.of(cfg).open_runs
    orphans = [r for r in (read_json(path) or []) if r not in _ACTIVE] if path.exists() else []
    ended = []
    for run_id in orphans:
        try:
            run = client(cfg).get_run(run_id)
        except Exception:  # deleted, or another store: nothing to end
            run = None
        if run is not None and run.info.status == "RUNNING":
            set_tags(cfg, run_id, {"hindsight.ended_by": "the next start in this run directory: its process was "
                                                         "killed before it could end the run"})
            write(cfg, run_id, "terminate", lambda r=run_id: client(cfg).set_terminated(r, status="KILLED"),
                  status="KILLED")
            ended.append(run_id)
        _record_open(cfg, run_id, False)
    return ended


_ACTIVE: dict[str, PipelineConfig] = {}  # runs this process started and has not ended


def _end_leftover_runs() -> None:
    """A process that ends (an uncaught error, Ctrl-C) never leaves its runs RUNNING."""
    for run_id, cfg in list(_ACTIVE.items()):
        try:
            end_run(cfg, run_id, "FAILED")
        except Exception:  # at exit: nothing left to report to
            pass


@contextmanager
def stage_run(cfg: PipelineConfig, name: str, parent_run_id: str | None, attempt: int, tags: dict | None = None):
    """An MLflow run for one attempt of a stage task.

    Each attempt (Prefect's run count, from the task) gets its own run tagged `hindsight.attempt`; a failed attempt ends
    FAILED with the cause in `hindsight.error`, so a retry is visible in the MLflow UI.
    """
    run_id = start_run(cfg, name, parent_run_id, {**(tags or {}), "hindsight.attempt": str(attempt)})
    try:
        yield run_id
    except (AlertStop, Preempted) as exc:  # stopped on purpose, resumable: not a failure of the code
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
        write(cfg, run_id, "params", lambda chunk=chunk: c.log_batch(run_id, params=[Param(k, v) for k, v in chunk.items()]),
               params=chunk)
    set_tags(cfg, run_id, {"data.md5": data_md5 or "unknown", "git.commit": git_commit(),
                           "version.torch": version("torch"), "version.transformers": version("transformers"),
                           "version.trl": version("trl"), "version.python": sys.version.split()[0]})


def set_tags(cfg: PipelineConfig, run_id: str, tags: dict[str, str]) -> None:
    tags = {k: str(v) for k, v in tags.items()}
    write(cfg, run_id, "tags", lambda: client(cfg).log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()]),
           tags=tags)


def log_decoding(cfg: PipelineConfig, run_id: str, record: dict) -> None:
    """The decoding a stage used (end tokens, settings, what the checkpoint asked for and did not
    get) as the tag `hindsight.decoding`, and one line on the console."""
    from hindsight.console import say
    from hindsight.rollout.decoding import describe

    set_tags(cfg, run_id, {"hindsight.decoding": json.dumps(record, sort_keys=True)})
    say(describe(record))


def log_json(cfg: PipelineConfig, run_id: str, obj, artifact_file: str) -> None:
    import json

    text = json.dumps(obj, indent=1)
    write(cfg, run_id, "text", lambda: client(cfg).log_text(run_id, text, artifact_file), text=text,
           artifact_file=artifact_file)


def log_artifact(cfg: PipelineConfig, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
    write(cfg, run_id, "artifact", lambda: client(cfg).log_artifact(run_id, str(path), artifact_path), path=str(path),
           artifact_path=artifact_path)


def end_run(cfg: PipelineConfig, run_id: str, status: str = "FINISHED") -> None:
    _ACTIVE.pop(run_id, None)
    _record_open(cfg, run_id, False)
    try:
        flush_metrics()
    finally:  # a failed flush still ends the run, and then raises
        write(cfg, run_id, "terminate", lambda: client(cfg).set_terminated(run_id, status=status), status=status)


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def sweep_parent_run(cfg: PipelineConfig, name: str, key: str) -> str:
    """The sweep's MLflow parent run; a rerun of the same sweep reopens it, so every trial stays under one parent."""
    c = client(cfg)
    found = c.search_runs([experiment_id(c, cfg)], f"tags.`hindsight.sweep_key` = '{key}'", max_results=1)
    if found:
        c.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    return start_run(cfg, "sweep", tags={"hindsight.sweep_key": key, "hindsight.sweep": name}, run_name=f"sweep-{name}")
