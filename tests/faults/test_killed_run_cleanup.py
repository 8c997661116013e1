"""A SIGKILLed run leaves half-written temporaries and MLflow runs RUNNING: the next start in the
same run directory removes the one and ends the other as KILLED, saying so in one line."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from hindsight.models.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]


def _run(work, env, fault=None):
    e = {**env, **({"HINDSIGHT_FAULT": fault} if fault else {})}
    proc = subprocess.Popen([sys.executable, "-m", "cli", "run", "rl", "-c", "rl.yaml"], cwd=work, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=600)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what the SIGKILL orphaned (the reward worker)
        except ProcessLookupError:
            pass
    return proc.returncode, out


def test_the_next_start_cleans_up_after_a_killed_run(tmp_path):
    init = build_tiny_model(tmp_path / "init", hidden=32, layers=1, heads=2)
    (tmp_path / "rl.yaml").write_text(
        f"name: killed\nmodel: {{base: tiny://demo}}\nsft: {{enabled: false}}\nreward_model: {{enabled: false}}\n"
        f"rl: {{init: {init}, steps: 3, prompts_per_step: 2, samples_per_prompt: 2, save_every: 1, "
        f"rollout: {{max_new_tokens: 3}}}}\neval: {{limit: 4, max_new_tokens: 3}}\nretries: {{count: 0}}\n")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("HINDSIGHT_FAULT", None)
    rc, out = _run(tmp_path, env, "update:1")
    assert rc == -signal.SIGKILL, out[-2000:]
    root = tmp_path / "runs" / "killed"
    client = MlflowClient(uri)
    killed = json.loads((root / "mlflow-open-runs.json").read_text())
    assert killed and all(client.get_run(r).info.status == "RUNNING" for r in killed)
    # what a kill in the middle of an atomic write leaves: a temporary file and folder of a dead pid
    (root / "rl" / "checkpoints" / ".manifest.json.tmp-999999").write_text("{half")
    (root / "rl" / "checkpoints" / "policy" / ".step-000002.tmp-999999").mkdir(parents=True)

    rc, out = _run(tmp_path, env)
    assert rc == 0, out[-3000:]
    assert "a killed run left 2 temporary files (removed) and 1 MLflow runs RUNNING (ended as KILLED)" in out
    assert not list(root.rglob("*.tmp-999999"))
    for run_id in killed:
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and "its process was killed" in run.data.tags["hindsight.ended_by"]
    assert not (root / "mlflow-open-runs.json").exists()  # none left open
