"""A sweep with early stop on: the trial set up to fail (a learning rate far too small to move the
weights) stops once its fitted accuracy curve cannot reach the leader's, and the ranking, the
trial's MLflow run and the sweep's parent run all say so and why."""
import json
import os
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]
SWEEP = f"""
name: es
base: {ROOT / "configs/demo.yaml"}
metric: eval/accuracy
max_concurrency: 1
early_stop: {{enabled: true, metric: eval/accuracy, min_steps: 6}}
set: {{rl.steps: 12, rl.save_every: 12, rl.eval_every: 2, rl.prompts_per_step: 8, reward_model.enabled: false,
       sft.epochs: 3, eval.limit: 200, eval.compare_versions: 0, data.dvc_file: null}}
params:
  rl.learner.lr: [2.0e-4, 1.0e-12]
"""


def test_a_trial_that_cannot_win_stops_early_and_the_ranking_says_why(tmp_path, prefect_api):
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
           "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "cli", "sweep", "-c", "sweep.yaml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ranked = json.loads((tmp_path / "runs/es/ranking.json").read_text())
    assert [(r["trial"], r["status"], r["rank"]) for r in ranked] == [("t00", "finished", 1), ("t01", "stopped", None)]
    why = ranked[1]["why"]
    assert why.startswith("early stop at step 6: the fitted eval/accuracy asymptote") and "trial t00's" in why
    assert f"t01 stopped: {why}" in (tmp_path / "runs/es/ranking.txt").read_text()
    steps = [json.loads(line)["step"] for line in (tmp_path / "runs/es/t01/rl/metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 6  # it trained no further
    flat = json.loads((tmp_path / "runs/es/curves/t01.json").read_text())
    lead = json.loads((tmp_path / "runs/es/curves/t00.json").read_text())
    assert lead["step"] == 12 and flat["hi"] < lead["lo"]

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("hindsight").experiment_id
    parent = client.search_runs([exp], "attributes.run_name = 'sweep-es'")[0]
    assert parent.data.tags["hindsight.stopped.t01"] == why
    trial_runs = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent.info.run_id}' and params.run_dir LIKE "
                                          "'%t01'")
    stopped = [r for r in trial_runs if r.info.status == "KILLED"]
    assert stopped and "early stop at step 6" in stopped[0].data.tags["hindsight.stopped"]
    assert "eval/curve/asymptote_hi" in stopped[0].data.metrics
