"""Stage retries through the real CLI, a real Prefect server and an MLflow sqlite store.

A transient failure is retried and the run completes; the retry shows in Prefect's task
states and as a failed-then-finished pair of MLflow runs. A permanent failure stops with
the stage and cause named, and the same command resumes once the cause is gone.
"""
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName, TaskRunFilterStartTime
from prefect.settings import PREFECT_API_URL, temporary_settings

from hindsight.data.demo import build_demo_data
from hindsight.models.tiny import build_tiny_model
from hindsight.state.ledger import Ledger

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def work(tmp_path, prefect_api):
    init = build_tiny_model(tmp_path / "init", hidden=32, layers=1, heads=2)
    build_demo_data(tmp_path / "data", seed=0)
    cfg = {"name": f"retry-{tmp_path.name[-12:]}".replace("_", "-"), "seed": 0,
           "data": {"dir": "data", "dvc_file": None, "build_demo": False},
           "sft": {"enabled": False}, "reward_model": {"enabled": False},
           "rl": {"init": str(init), "steps": 4, "prompts_per_step": 2, "samples_per_prompt": 2, "save_every": 2,
                  "rollout": {"max_new_tokens": 3}, "kl": {"coef": 0.0}, "eval_every": 100},
           "eval": {"limit": 4, "max_new_tokens": 3}, "retries": {"count": 1, "delay_s": 0}}
    (tmp_path / "rl.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PYTHONPATH": str(ROOT),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    return tmp_path, env, cfg["name"]


def _rl(work, env, fault=None):
    e = {**env, "HINDSIGHT_FAULT": fault} if fault else {k: v for k, v in env.items() if k != "HINDSIGHT_FAULT"}
    return subprocess.run([sys.executable, "-m", "cli", "run", "rl", "-c", "rl.yaml"], cwd=work, env=e,
                          capture_output=True, text=True, timeout=600)


def _rl_runs(env):
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs(client.get_experiment_by_name("hindsight").experiment_id,
                              "tags.`hindsight.stage` = 'rl'", order_by=["attribute.start_time ASC"])
    return client, runs


def _shard_steps(work, name):
    return sorted(p.name for p in (work / "runs" / name / "rl" / "rollouts").glob("*.parquet"))


def test_transient_failure_is_retried_and_visible_in_prefect_and_mlflow(work, prefect_api):
    work, env, name = work
    result = _rl(work, env, fault="raise:update:2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Retry 1/1 will start" in result.stderr

    with temporary_settings({PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        stage_runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="rl-stage")))
        mine = [r for r in stage_runs if r.run_count == 2 and r.state.is_completed()]
        assert mine, [(r.name, r.run_count, r.state.type) for r in stage_runs]
        history = [s.name for s in client.read_task_run_states(mine[-1].id)]
    assert history[-2:] == ["Retrying", "Completed"], history

    client, runs = _rl_runs(env)
    assert [r.info.status for r in runs] == ["FAILED", "FINISHED"]
    assert [r.data.tags["hindsight.attempt"] for r in runs] == ["1", "2"]
    assert "injected transient fault at update step 2" in runs[0].data.tags["hindsight.error"]
    assert runs[1].data.tags["hindsight.resumed_from_step"] == "2"  # the retry resumed, not restarted
    assert _shard_steps(work, name) == [f"step-{s:06d}.parquet" for s in range(1, 5)]
    assert client.get_model_version_by_alias(f"{name}-policy", "latest").run_id == runs[1].info.run_id


def test_permanent_failure_names_the_stage_and_the_rerun_resumes(work):
    work, env, name = work
    failed = _rl(work, env, fault="fail:update:2")
    assert failed.returncode == 1
    errors = [line for line in failed.stderr.splitlines() if line.startswith("error:")]
    assert errors == [errors[0]] and errors[0].startswith(
        "error: stage rl failed after 2 attempt(s): RuntimeError: injected permanent fault at update step 2")
    assert (work / "runs" / name / "rl" / "checkpoints" / "manifest.json").exists()
    stored = _shard_steps(work, name)
    assert stored == [f"step-{s:06d}.parquet" for s in range(1, 4)]  # step 2 was sampled before the update failed

    rerun = _rl(work, env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    _, runs = _rl_runs(env)
    assert [r.info.status for r in runs] == ["FAILED", "FAILED", "FINISHED"]
    assert runs[-1].data.tags["hindsight.resumed_from_step"] == "2"
    assert runs[-1].data.metrics["runtime/rollout/reused"] == 1.0  # step 2's stored shard was trained on, not resampled
    assert _shard_steps(work, name) == [f"step-{s:06d}.parquet" for s in range(1, 5)]


def test_a_failed_rollout_is_retried_as_its_steps_task_and_re_leases_its_work(work, prefect_api):
    """A transient failure in a step's rollout (after the step's groups were written) is
    retried by Prefect as the task of its checkpoint interval (steps 0-1), not as the stage:
    one MLflow attempt, the retry continues at step 1 (step 0 is not trained twice: the update
    would refuse), the step's parts kept and merged, no group sampled twice."""
    work, env, name = work
    began = datetime.now(timezone.utc)  # the session shares one Prefect server: this test's task runs start after
    result = _rl(work, env, fault="raise:rollout:1")
    assert result.returncode == 0, result.stderr[-3000:]
    with temporary_settings({PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="steps-"),
                                                                   start_time=TaskRunFilterStartTime(after_=began)))
        assert sorted(r.name for r in runs) == ["steps-0-2", "steps-2-4"]  # one task per checkpoint interval
        retried = [r for r in runs if r.run_count == 2 and r.state.is_completed()]
        assert [r.name for r in retried] == ["steps-0-2"], [(r.name, r.run_count, r.state.type) for r in runs]
        assert [s.name for s in client.read_task_run_states(retried[0].id)][-2:] == ["Retrying", "Completed"]
    _, mlflow_runs = _rl_runs(env)
    assert [r.data.tags["hindsight.attempt"] for r in mlflow_runs] == ["1"]  # the stage itself never retried
    ledger = Ledger(work / "runs" / name / "rl").read(1)
    assert [e.leases for e in ledger.values()] == [1, 1] and [e.trained for e in ledger.values()] == [1, 1]
