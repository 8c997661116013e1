"""prefect.yaml for real: a server on loopback, a process work pool, `prefect deploy`, a worker:
a worker killed mid-RL, and the flow run retried to completion; the Kubernetes pool's template;
a sweep whose trials are deployment runs. (A deployment run to Completed on the process pool is
tests/deploy/test_deploy_doc.py's: docs/deploy.md's own blocks, run as written.)

Everything is a real process; the only shortcut is marking the orphaned flow run Crashed by
API, which is what Prefect's zombie-flow automation does after missed heartbeats (docs/deploy.md).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Crashed

from hindsight.config import load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ws(tmp_path_factory, prefect_api):
    work = tmp_path_factory.mktemp("deploy")
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_HOME": str(work / "prefect-home"),
           "HINDSIGHT_WORKDIR": str(work), "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
           "PYTHONPATH": str(ROOT), "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "2",
           "HINDSIGHT_IMAGE": "hindsight:test", "HINDSIGHT_DVC_REMOTE": "s3://bucket/dvc"}
    prefect = lambda *a: subprocess.run([sys.executable, "-m", "prefect", *a], cwd=ROOT, env=env,  # noqa: E731
                                        capture_output=True, text=True, timeout=300)
    made = prefect("work-pool", "create", "hindsight-local", "--type", "process")
    assert made.returncode == 0, made.stdout + made.stderr
    deployed = prefect("--no-prompt", "deploy", "--name", "pipeline-local")
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    return work, env, prefect


def start_worker(work, env, name):
    log = open(work / f"{name}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", "hindsight-local",
                             "--name", name], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, work / f"{name}.log"


def stop(proc, sig=signal.SIGTERM):
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def params(**sets) -> str:
    overrides = ["negative_ft.enabled=false", *(f"{k}={v}" for k, v in sets.items())]
    cfg = load_config(ROOT / "configs/smoke.yaml", overrides)
    return json.dumps({"cfg": cfg.model_dump(mode="json", by_alias=True)})


def flow_run_pids(run_id: str) -> list[int]:
    """Processes running this flow run (the worker passes its id in the environment)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and f"PREFECT__FLOW_RUN_ID={run_id}".encode() in (proc / "environ").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def flow_run(api, run_id):
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        return client.read_flow_run(run_id)


def wait_state(api, run_id, want, timeout=600):
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = flow_run(api, run_id).state
        if state.type.value in want or state.is_final():
            return state
        time.sleep(2)
    raise AssertionError(f"flow run {run_id} not in {want} after {timeout}s: {state.type.value}")


def trigger(prefect, parameters) -> str:
    res = prefect("deployment", "run", "pipeline/pipeline-local", "--params", parameters)
    assert res.returncode == 0, res.stdout + res.stderr
    return re.search(r"UUID: ([0-9a-f-]{36})", res.stdout).group(1)


def test_worker_killed_mid_rl_then_the_flow_run_is_retried_and_resumes(ws, prefect_api):
    work, env, prefect = ws
    worker, _ = start_worker(work, env, "worker-b")
    manifest = work / "runs/killed/rl/checkpoints/manifest.json"
    try:
        # RL alone (from the base, no reward model), a checkpoint every step: the kill lands
        # between two checkpoints of a run that has more steps to go.
        run_id = trigger(prefect, params(run_dir="runs/killed", **{
            "sft.enabled": "false", "reward_model.enabled": "false", "rl.init": "tiny://demo",
            "rl.scoring.reward_model_weight": 0, "rl.steps": 4, "rl.save_every": 1, "rl.eval_every": 100}))
        deadline = time.time() + 600
        while not manifest.exists() and time.time() < deadline:
            time.sleep(0.2)
        assert manifest.exists(), (work / "worker-b.log").read_text()[-3000:]
    finally:
        # The machine goes away: the worker and the flow-run process it started (Prefect puts
        # that one in its own session, so it is found by its flow-run id), both SIGKILLed mid-RL.
        stop(worker, signal.SIGKILL)
        victims = flow_run_pids(run_id)
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
    assert victims, "the flow-run process was not found"
    time.sleep(1)
    assert flow_run_pids(run_id) == []
    killed_at = json.loads(manifest.read_text())["step"]
    assert 1 <= killed_at < 4
    assert flow_run(prefect_api, run_id).state.type.value == "RUNNING"  # orphaned: nobody will finish it
    with temporary_settings({PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        client.set_flow_run_state(run_id, Crashed(message="worker killed"), force=True)
    retry = prefect("flow-run", "retry", run_id)
    assert retry.returncode == 0, retry.stdout + retry.stderr
    assert flow_run(prefect_api, run_id).state.type.value == "SCHEDULED"
    worker, log = start_worker(work, env, "worker-c")
    try:
        state = wait_state(prefect_api, run_id, {"COMPLETED"})
    finally:
        stop(worker)
    assert state.type.value == "COMPLETED", log.read_text()[-4000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("hindsight")
    rl_runs = client.search_runs([exp.experiment_id], "tags.`hindsight.stage` = 'rl' and attributes.status = 'FINISHED'",
                                 order_by=["attributes.start_time DESC"])
    resumed = int(rl_runs[0].data.tags["hindsight.resumed_from_step"])
    assert resumed >= killed_at  # the RL stage resumed from what the killed run stored
    assert (work / "runs/killed/rl/rollouts/step-000004.parquet").exists()


def test_kubernetes_pool_accepts_the_gpu_job_template_and_renders_it(ws, prefect_api):
    from prefect.utilities.templating import apply_values, find_placeholders

    work, env, prefect = ws
    template = ROOT / "deploy/k8s/base-job-template.json"
    made = prefect("work-pool", "create", "hindsight-k8s", "--type", "kubernetes", "--base-job-template", str(template))
    assert made.returncode == 0, made.stdout + made.stderr
    deployed = prefect("--no-prompt", "deploy", "--name", "rl-k8s")
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    with temporary_settings({PREFECT_API_URL: prefect_api}), get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name("rl/rl-k8s")
        pool = client.read_work_pool("hindsight-k8s")
    assert "cfg" in dep.parameter_openapi_schema["properties"]  # the pydantic schema: the UI's form
    jv = dep.job_variables
    assert jv["env"]["MLFLOW_TRACKING_URI"] == env["MLFLOW_TRACKING_URI"] and jv["image"] == "hindsight:test"
    defaults = {k: v.get("default") for k, v in pool.base_job_template["variables"]["properties"].items()}
    values = {**defaults, **jv, "command": "prefect flow-run execute", "name": "rl", "labels": {}}
    job = apply_values(pool.base_job_template["job_configuration"], values)
    assert not find_placeholders(json.dumps(job))
    container = job["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "runs", "mountPath": "/runs"} in container["volumeMounts"]
    assert container["env"]["HINDSIGHT_DVC_REMOTE"] == "s3://bucket/dvc"
    assert dep.pull_steps[0]["prefect.deployments.steps.set_working_directory"]["directory"] == "/runs"


def test_sweep_submits_trials_as_deployment_runs_to_the_pool(ws, prefect_api):
    work, env, prefect = ws
    deployed = prefect("--no-prompt", "deploy", "--name", "rl-local")
    assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
    (work / "sweep.yaml").write_text(
        f"name: sweep-dep\nbase: {ROOT / 'configs/smoke.yaml'}\ndeployment: rl/rl-local\nmax_concurrency: 2\n"
        "set: {rl.steps: 2, rl.save_every: 2, rl.eval_every: 2, negative_ft.enabled: false}\n"
        "params:\n  rl.learner.lr: [1.0e-4, 3.0e-4]\n")
    worker, log = start_worker(work, env, "worker-sweep")
    try:
        res = subprocess.run([sys.executable, "-m", "cli", "sweep", "-c", "sweep.yaml"], cwd=work, env=env,
                             capture_output=True, text=True, timeout=900)
    finally:
        stop(worker)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ranked = json.loads((work / "runs/sweep-dep/ranking.json").read_text())
    assert [r["status"] for r in ranked] == ["finished", "finished"]
    for r in ranked:  # each trial was a flow run of the rl-local deployment, picked up by the worker
        assert f"submitting flow run '{r['flow_run']}'" in log.read_text()
        assert flow_run(prefect_api, r["flow_run"]).state.type.value == "COMPLETED"
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    assert str(client.get_model_version_by_alias("smoke-policy", "best").version) == ranked[0]["version"]
    # SFT and the reward model trained once, in the sweep's own process, for both trials
    assert [len(client.search_model_versions(f"name='smoke-{m}'")) for m in ("sft", "rm")] == [1, 1]
