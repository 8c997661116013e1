"""The smoke pipeline against a real shared `mlflow server` (sqlite backend, proxied artifact
root) on loopback, as the README shows for a team: runs, metrics, artifacts and the registry
all go through the server's REST API."""
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    home = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{home}/mlflow.db",
                             "--artifacts-destination", str(home / "artifacts"), "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError((home / "server.log").read_text()[-2000:])
            time.sleep(0.5)
    else:
        raise RuntimeError("mlflow server did not become healthy")
    yield url, home
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def test_smoke_pipeline_against_a_shared_mlflow_server(mlflow_server, prefect_api, tmp_path):
    url, home = mlflow_server
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": url, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "hindsight.cli", "run", "pipeline", "-c", str(ROOT / "configs/smoke.yaml"),
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
