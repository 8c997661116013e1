"""A version is registered only by a run that finishes: a failure after the registration deletes
it again (`@latest` falls back to the version before), and a failing end-of-run look-back is one
error line while the model stays registered from a FINISHED run."""
import os
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.configs import rl_only, write

ROOT = Path(__file__).resolve().parents[2]


def _rl(tmp_path, env, *extra):
    return subprocess.run([sys.executable, "-m", "cli", "run", "rl", "-c", "rl.yaml", *extra], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


def test_a_run_failing_after_registering_leaves_latest_on_the_version_before(tiny_init, tmp_path):
    work, init = tiny_init
    write(tmp_path / "rl.yaml", {**rl_only("safe", work / "data", init), "retries": {"count": 0, "delay_s": 0}})
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
    env.pop("HINDSIGHT_FAULT", None)
    assert _rl(tmp_path, env).returncode == 0
    client = MlflowClient(uri, registry_uri=uri)
    assert str(client.get_model_version_by_alias("safe-policy", "latest").version) == "1"

    failed = _rl(tmp_path, {**env, "HINDSIGHT_FAULT": "fail:registered:0"}, "--force")
    assert failed.returncode == 1, failed.stderr[-3000:]
    versions = client.search_model_versions("name='safe-policy'")
    assert [str(v.version) for v in versions] == ["1"]  # v2 was registered, then withdrawn
    assert str(client.get_model_version_by_alias("safe-policy", "latest").version) == "1"
    runs = client.search_runs([client.get_experiment_by_name("hindsight").experiment_id],
                              filter_string="tags.`hindsight.stage` = 'rl'", order_by=["attributes.start_time DESC"])
    assert runs[0].info.status == "FAILED"


def test_a_failing_look_back_is_one_error_line_and_the_model_stays_registered(tiny_init, tmp_path):
    work, init = tiny_init
    write(tmp_path / "rl.yaml", rl_only("look", work / "data", init))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT), "HINDSIGHT_FAULT": "fail:lookback:0"}
    res = _rl(tmp_path, env)
    assert res.returncode == 0, res.stderr[-3000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: rl: the end-of-run look-back failed (RuntimeError: injected permanent fault at lookback "
                      "step 0); version 1 is registered, its comparison report is missing"]
    assert "Traceback" not in res.stderr
    client = MlflowClient(uri, registry_uri=uri)
    mv = client.get_model_version_by_alias("look-policy", "latest")
    run = client.get_run(mv.run_id)
    assert run.info.status == "FINISHED" and "injected permanent fault" in run.data.tags["hindsight.lookback_error"]
