"""Sweep trials as tasks: each runs `hindsight run rl` in its own process.

A process per trial, not a thread: sampling seeds torch's global RNG, so trials sharing a
process would draw from one generator and stop being reproducible. The child reports to
the same Prefect API and MLflow store, nested under the sweep's parent run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml
from prefect import task

from hindsight.config import PipelineConfig
from hindsight.errors import StageError
from hindsight.fsutil import atomic_write_bytes
from hindsight.state.rundir import RunDir
import tracking
from tasks.cache import cache_key_from_inputs


@task(name="trial", cache_key_fn=cache_key_from_inputs, persist_result=True)
def trial_task(cfg: PipelineConfig, trial: str, params: dict, parent_run_id: str, metric: str,
               api_url: str | None, cache_key: str) -> dict:
    """One trial's RL stage; raises (and is not cached) when the trial fails."""
    run = RunDir(cfg.root).claim()
    cfg_file, result_file, log_file = run.trial_config, run.trial_result, run.trial_log
    atomic_write_bytes(cfg_file, yaml.safe_dump(cfg.model_dump(mode="json", by_alias=True)).encode())
    result_file.unlink(missing_ok=True)
    env = {**os.environ, **({"PREFECT_API_URL": api_url} if api_url else {})}
    cmd = [sys.executable, "-m", "cli", "run", "rl", "-c", str(cfg_file),
           "--parent-run-id", parent_run_id, "--result-json", str(result_file)]
    with open(log_file, "w") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        lines = log_file.read_text(errors="replace").splitlines()
        why = next((ln for ln in reversed(lines) if ln.startswith(("error:", "stopped:"))), lines[-1] if lines else "")
        early = why.partition("early stop at step")
        if proc.returncode == 3 and early[1]:  # the sweep's own rule (lookback.early_stop), not a failure
            return {"trial": trial, **params, "status": "stopped", "why": (early[1] + early[2]).split(". ")[0],
                    metric: None, "run_dir": str(cfg.root)}
        raise StageError(f"trial {trial} exited {proc.returncode}: {why} (log: {log_file})")
    result = json.loads(result_file.read_text())
    metrics = tracking.client(cfg).get_run(result["run_id"]).data.metrics
    return {"trial": trial, **params, "status": "finished", metric: metrics.get(metric),
            "reward/mean": metrics.get("reward/mean"), "version": result["version"],
            "run_id": result["run_id"], "run_dir": str(cfg.root)}


@task(name="trial", cache_key_fn=cache_key_from_inputs, persist_result=True)
def deployment_trial_task(cfg: PipelineConfig, trial: str, params: dict, parent_run_id: str, metric: str,
                          deployment: str, cache_key: str) -> dict:
    """One trial as a run of an RL deployment: a worker of its pool picks it up; the result is
    read back from the shared MLflow store (the flow run and this process share the store)."""
    from prefect.deployments import run_deployment

    flow_run = run_deployment(deployment, parameters={"cfg": cfg.model_dump(mode="json", by_alias=True),
                                                      "parent_run_id": parent_run_id}, timeout=None)
    if not flow_run.state.is_completed():
        raise StageError(f"trial {trial}: flow run {flow_run.name} of {deployment} ended {flow_run.state.type.value}: "
                         f"{flow_run.state.message}")
    c = tracking.client(cfg)
    runs = c.search_runs([tracking.experiment_id(c, cfg)],
                         f"tags.mlflow.parentRunId = '{parent_run_id}' and params.run_dir = '{cfg.run_dir}' "
                         "and attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise StageError(f"trial {trial}: flow run {flow_run.name} completed but its RL run is not in {c.tracking_uri} "
                         f"(do the workers use the same MLFLOW_TRACKING_URI?)")
    run = runs[0]
    version = c.search_model_versions(f"run_id = '{run.info.run_id}'")[0].version
    return {"trial": trial, **params, "status": "finished", metric: run.data.metrics.get(metric),
            "reward/mean": run.data.metrics.get("reward/mean"), "version": str(version),
            "run_id": run.info.run_id, "run_dir": str(cfg.root), "flow_run": str(flow_run.id)}
