"""The whole chain on the smoke config, through the real CLI, Prefect and an MLflow sqlite store."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]


def _hindsight(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("pipeline")
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
           "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    first = _hindsight(["run", "pipeline", "-c", str(ROOT / "configs/smoke.yaml")], work, env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return work, env, first


def test_pipeline_registers_every_stage_with_aliases(smoke_run):
    work, env, _ = smoke_run
    client = MlflowClient(env["MLFLOW_TRACKING_URI"], registry_uri=env["MLFLOW_TRACKING_URI"])
    for name in ("smoke-sft", "smoke-rm", "smoke-policy", "smoke-negft"):
        mv = client.get_model_version_by_alias(name, "latest")
        assert str(mv.version) == "1"
        assert client.download_artifacts(mv.run_id, "checkpoint", str(work / f"dl-{name}"))
        assert (work / f"dl-{name}" / "checkpoint" / "config.json").exists()


def test_pipeline_logs_nested_runs_and_metrics(smoke_run):
    _, env, _ = smoke_run
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("hindsight")
    runs = client.search_runs([exp.experiment_id])
    by_name = {r.data.tags["hindsight.stage"]: r for r in runs}
    parent = by_name["pipeline"]
    project = by_name["rl"].data.params["name"]
    assert parent.info.run_name == f"pipeline · {project}"
    for stage in ("sft", "reward-model", "rl"):
        run = by_name[stage]
        # told apart in MLflow's table: the stage, the config's name and the version it registered
        assert re.fullmatch(rf"{stage} · {project} → {project}-\S+ v\d+", run.info.run_name), run.info.run_name
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["data.md5"].endswith(".dir")
        assert run.data.tags["version.trl"] and run.data.tags["git.commit"]
        assert run.data.params["rl.samples_per_prompt"] == "4"
    rl = by_name["rl"].info.run_id
    for metric in ("reward/mean", "policy/kl", "policy/entropy", "policy/loss", "response_length/mean"):
        steps = [m.step for m in client.get_metric_history(rl, metric)]
        assert steps == [1, 2, 3, 4], metric
    rm = by_name["reward-model"].data.metrics  # measured on the 150 of 1,500 pairs it never trained on
    assert rm["eval/pairs"] == 144.0 and 0.0 <= rm["eval/pairwise_accuracy"] <= 1.0
    negft = by_name["negative-ft"]
    assert negft.data.tags["mlflow.parentRunId"] == parent.info.run_id
    for metric in ("eval/accuracy", "eval/accuracy_before", "negative_ft/unlikelihood", "negative_ft/negatives"):
        assert metric in negft.data.metrics, metric
    assert negft.data.metrics["negative_ft/negatives"] > 0
    acc_steps = [m.step for m in client.get_metric_history(rl, "eval/accuracy")]
    assert acc_steps[0] == 0 and acc_steps[-1] == 4
    assert client.get_metric_history(by_name["sft"].info.run_id, "eval/accuracy")


def test_rollouts_are_persisted_between_tasks(smoke_run):
    work, _, _ = smoke_run
    rl_dir = work / "runs" / "smoke" / "rl"
    for comp in ("rollouts", "scores"):
        assert sorted(p.name for p in (rl_dir / comp).glob("*.parquet")) == \
            [f"step-{i:06d}.parquet" for i in range(1, 5)]


def test_rerun_reuses_cached_stages_and_rl_alone_resolves_registry(smoke_run):
    work, env, _ = smoke_run
    again = _hindsight(["run", "pipeline", "-c", str(ROOT / "configs/smoke.yaml")], work, env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("Cached(type=COMPLETED)") + again.stderr.count("Cached(type=COMPLETED)") >= 3
    # the summary's `cached` column is Prefect's own state: every stage came from the cache
    for stage in ("sft", "reward-model", "rl", "negative-ft"):
        row = next(line for line in again.stdout.splitlines() if line.startswith(f"│ {stage} "))
        assert row.rstrip("│ ").endswith("yes"), row
    # rl alone, in a new process, resolving smoke-sft@latest from the registry; --force reruns it
    alone = _hindsight(["run", "rl", "-c", str(ROOT / "configs/smoke.yaml"), "--force",
                        "--set", "run_dir=runs/smoke-alone"], work, env)
    assert alone.returncode == 0, alone.stderr[-3000:]
    forced = next(line for line in alone.stdout.splitlines() if line.startswith("│ rl "))
    assert forced.rstrip("│ ").endswith("no"), forced  # --force trained anew: not a cache hit
    client = MlflowClient(env["MLFLOW_TRACKING_URI"], registry_uri=env["MLFLOW_TRACKING_URI"])
    assert str(client.get_model_version_by_alias("smoke-policy", "latest").version) == "2"


def test_the_pipeline_log_is_quiet(smoke_run):
    """What a person reads (issue 14): no bytecode listings captured from third-party prints,
    no line per Prefect task state, and about one line per RL step."""
    import re

    _, _, first = smoke_run
    lines = first.stderr.splitlines()
    bytecode = re.compile(r"\b\d+\s+\d*\s*(LOAD_|STORE_|CALL|RETURN_|BINARY_|POP_|JUMP_)[A-Z_]*\b")
    assert not [ln for ln in lines if bytecode.search(ln)]
    assert not [ln for ln in lines if "Finished in state Completed()" in ln]
    steps = 4  # configs/smoke.yaml: rl.steps
    rl_lines = [ln for ln in lines if "rl step" in ln]
    assert 1 <= len(rl_lines) <= 3 * steps, rl_lines
