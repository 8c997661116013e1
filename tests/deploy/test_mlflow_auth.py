"""The shared MLflow recipe of docs/deploy.md with MLflow's built-in basic auth, on loopback: an
unauthenticated write is refused, and the RL stage runs and registers with the credentials from
the environment (MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD), everything through the
server (runs, metrics, proxied artifacts, the registry), nothing in a local store."""
import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path


from tests.configs import rl_only, write
from tests.conftest import _free_port, served

ROOT = Path(__file__).resolve().parents[2]
INI = """[mlflow]
default_permission = READ
database_uri = sqlite:///{home}/basic_auth.db
admin_username = admin
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
"""


def _post(url: str, body: dict, auth: tuple[str, str] | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_basic_auth_refuses_anonymous_writes_and_the_pipeline_runs_with_credentials(tiny_init, prefect_api, tmp_path):
    work, init = tiny_init
    home, port = tmp_path / "mlflow", _free_port()
    home.mkdir()
    (home / "basic_auth.ini").write_text(INI.format(home=home))
    secret = "s3cret-for-the-test"
    server_env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(home / "basic_auth.ini"),
                  "MLFLOW_AUTH_ADMIN_PASSWORD": secret, "MLFLOW_FLASK_SERVER_SECRET_KEY": "csrf-key-for-the-test"}
    cmd = [sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{home}/mlflow.db", "--artifacts-destination", str(home / "artifacts"),
           "--workers", "1"]
    url = f"http://127.0.0.1:{port}"
    with served(cmd, f"{url}/health", home, env=server_env, timeout=180):
        create = f"{url}/api/2.0/mlflow/registered-models/create"
        assert _post(create, {"name": "anonymous"}) == 401
        assert _post(create, {"name": "wrong"}, ("admin", "guess")) == 401
        write(tmp_path / "rl.yaml", rl_only("authed", work / "data", init))
        env = {**os.environ, "MLFLOW_TRACKING_URI": url, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": prefect_api,
               "MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": secret}
        res = subprocess.run([sys.executable, "-m", "cli", "run", "rl", "-c", "rl.yaml"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-3000:]
        from mlflow.tracking import MlflowClient

        os.environ.update({"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": secret})
        try:
            client = MlflowClient(url, registry_uri=url)
            mv = client.get_model_version_by_alias("authed-policy", "latest")
            assert str(mv.version) == "1"
            # a shared server: runs, metrics, artifacts and the registry all went through its REST API
            assert mv.source.startswith("mlflow-artifacts:/")  # stored by the server, not on the client's disk
            assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "mlartifacts").exists()
            assert list((home / "artifacts").rglob("model.safetensors"))
            rl = client.get_run(mv.run_id)
            assert rl.data.metrics["eval/accuracy"] >= 0 and "reward/mean" in rl.data.metrics
            assert {"reports", "plots"} <= {f.path for f in client.list_artifacts(mv.run_id)}
        finally:
            for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
                os.environ.pop(k, None)
        anonymous = subprocess.run([sys.executable, "-m", "cli", "run", "rl", "-c", "rl.yaml", "--force"], cwd=tmp_path,
                                   env={k: v for k, v in env.items()
                                        if k not in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")},
                                   capture_output=True, text=True, timeout=600)
        errors = [line for line in anonymous.stderr.splitlines() if line.startswith("error:")]
        assert anonymous.returncode == 1 and len(errors) == 1 and "Traceback" not in anonymous.stderr, \
            anonymous.stderr[-3000:]
        assert f"the MLflow server at {url} asks for credentials: set MLFLOW_TRACKING_USERNAME" in errors[0], errors
