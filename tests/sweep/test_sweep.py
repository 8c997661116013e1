"""`hindsight sweep` for real: concurrent trial processes nested under one MLflow parent, a
ranked table and plots, NAME-policy@best, a failing trial isolated, and the cache on rerun."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hindsight.errors import ConfigError
from hindsight.config.sweep import SweepConfig, load_sweep, rank, trial_params

ROOT = Path(__file__).resolve().parents[2]
SWEEP = f"""
name: sweep-test
base: {ROOT / "configs/smoke.yaml"}
metric: eval/accuracy
max_concurrency: 2
set: {{rl.steps: 2, rl.save_every: 2, rl.eval_every: 2, negative_ft.enabled: false}}
params:
  rl.scoring.rewards:
    - [{{fn: "rewards.exact:exact_answer", weight: 1.0}}]
    - [{{fn: "sweep_rewards:wrong_length"}}]
    - [{{fn: "rewards.exact:exact_answer", weight: 2.0}}]
"""


def hindsight(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def swept(tmp_path_factory, prefect_api):
    work = tmp_path_factory.mktemp("sweep")
    (work / "sweep.yaml").write_text(SWEEP)
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
           "PYTHONPATH": f"{ROOT}:{ROOT / 'tests/sweep'}"}
    first = hindsight(["sweep", "-c", "sweep.yaml"], work, env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return work, env, first


def test_trials_are_nested_ranked_and_the_best_is_aliased(swept):
    work, env, first = swept
    ranked = json.loads((work / "runs/sweep-test/ranking.json").read_text())
    assert [r["status"] for r in ranked] == ["finished"] * 2 + ["failed"]
    assert ranked[-1]["trial"] == "t01" and "returned 17 scores for 16 completions" in ranked[-1]["error"]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("hindsight")
    parent = client.search_runs([exp.experiment_id], "attributes.run_name = 'sweep-sweep-test'")[0]
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(r.info.status for r in children if r.data.tags.get("hindsight.stage") == "rl") == ["FAILED"] + ["FINISHED"] * 2
    assert {r.data.params["run_dir"] for r in children} == {f"runs/sweep-test/t0{i}" for i in range(3)}
    artifacts = {f.path for f in client.list_artifacts(parent.info.run_id, "sweep")}
    assert {"sweep/ranking.txt", "sweep/ranking.json", "sweep/curves.png", "sweep/accuracy.png"} <= artifacts
    best = client.get_model_version_by_alias("smoke-policy", "best")
    assert str(best.version) == str(ranked[0]["version"]) and best.run_id == ranked[0]["run_id"]
    assert parent.data.tags["hindsight.best_trial"] == ranked[0]["trial"]
    table = (work / "runs/sweep-test/ranking.txt").read_text()
    assert table.splitlines()[0].split()[:2] == ["rank", "trial"] and table in first.stdout + first.stderr


def test_rerun_skips_finished_trials_and_retries_the_failed_one(swept):
    work, env, _ = swept
    again = hindsight(["sweep", "-c", "sweep.yaml"], work, env)
    assert again.returncode == 0, again.stderr[-3000:]
    out = again.stdout + again.stderr
    cached = [t for t in ("t00", "t02") if f"Task run 'trial-{t}' - Finished in state Cached" in out]
    assert cached == ["t00", "t02"]
    assert "trial t01 failed" in out  # not cached: tried again
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("hindsight")
    parents = client.search_runs([exp.experiment_id], "attributes.run_name = 'sweep-sweep-test'")
    assert len(parents) == 1  # the rerun reopened the same parent


def test_grid_random_and_ranking_logic(tmp_path):
    grid = SweepConfig(name="s", base="b.yaml", params={"rl.learner.lr": [1, 2], "rl.algorithm": ["grpo", "rloo", "ppo"]})
    assert len(trial_params(grid)) == 6 and trial_params(grid)[1] == {"rl.learner.lr": 1, "rl.algorithm": "rloo"}
    rnd = SweepConfig(name="s", base="b.yaml", method="random", trials=5, seed=3,
                      params={"rl.learner.lr": {"low": 1e-5, "high": 1e-3, "log": True}})
    draws = [p["rl.learner.lr"] for p in trial_params(rnd)]
    assert draws == [p["rl.learner.lr"] for p in trial_params(rnd)] and all(1e-5 <= d <= 1e-3 for d in draws)
    rows = [{"trial": "a", "status": "finished", "m": 0.5}, {"trial": "b", "status": "failed"},
            {"trial": "c", "status": "finished", "m": 0.9}]
    assert [(r["trial"], r["rank"]) for r in rank(rows, "m", "max")] == [("c", 1), ("a", 2), ("b", None)]
    assert [r["trial"] for r in rank(rows, "m", "min")][:2] == ["a", "c"]


def test_bad_sweep_keys_name_the_file(tmp_path):
    (tmp_path / "s.yaml").write_text(f"name: s\nbase: {ROOT / 'configs/smoke.yaml'}\nparams:\n  rl.lrr: [1, 2]\n")
    with pytest.raises(ConfigError, match=r"s.yaml: trial t00 .*rl.lrr: unknown key"):
        from hindsight.config.sweep import trial_config

        sweep, base, _ = load_sweep(tmp_path / "s.yaml")
        trial_config(sweep, base, 0, trial_params(sweep)[0], tmp_path / "s.yaml")
    (tmp_path / "s.yaml").write_text(f"name: s\nbase: {ROOT / 'configs/smoke.yaml'}\nmethod: grid\nparams:\n"
                                     "  rl.learner.lr: {low: 1, high: 2}\n")
    with pytest.raises(ConfigError, match=r"s.yaml.*a grid needs a list"):
        load_sweep(tmp_path / "s.yaml")
