"""The smoke pipeline against a real shared `mlflow server` (sqlite backend, proxied artifact
root) on loopback, as the README shows for a team: runs, metrics, artifacts and the registry
all go through the server's REST API."""
import os
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_pipeline_against_a_shared_mlflow_server(mlflow_server, prefect_api, tmp_path):
    url, home = mlflow_server
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": url, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "cli", "run", "pipeline", "-c", str(ROOT / "configs/smoke.yaml"),
                          "--set", "negative_ft.enabled=false"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    client = MlflowClient(url, registry_uri=url)
    mv = client.get_model_version_by_alias("smoke-policy", "latest")
    assert mv.source.startswith("mlflow-artifacts:/")  # stored by the server, not on the client's disk
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()
    assert list((home / "artifacts").rglob("model.safetensors"))
    rl = client.get_run(mv.run_id)
    assert rl.data.metrics["eval/accuracy"] >= 0 and "reward/mean" in rl.data.metrics
    assert {"reports", "plots"} <= {f.path for f in client.list_artifacts(mv.run_id)}
