"""The MLflow server dies in the middle of an RL run: training goes on, what the server did not
get is spooled in the run directory, and after the server is back `hindsight sync` sends it
all: every step's metrics, the artifacts, the final status and the registration."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.configs import rl_only, write
from tests.conftest import _free_port, served

ROOT = Path(__file__).resolve().parents[2]
STEPS = 12


def _mlflow(home: Path, port: int):
    return served([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                   "--backend-store-uri", f"sqlite:///{home}/mlflow.db", "--artifacts-destination",
                   str(home / "artifacts"), "--workers", "1"], f"http://127.0.0.1:{port}/health", home)


def _steps_logged(metrics_file: Path) -> int:
    if not metrics_file.exists():
        return 0
    return sum(1 for line in metrics_file.read_text().splitlines() if line.strip())


def test_killing_the_mlflow_server_mid_run_loses_nothing_after_sync(tiny_init, prefect_api, tmp_path):
    work, init = tiny_init
    write(tmp_path / "rl.yaml", rl_only("outage", work / "data", init, steps=STEPS, prompts_per_step=4,
                                        samples_per_prompt=4, kl={"coef": 0.0}, eval_every=100, save_every=4,
                                        report_every=4, rollout={"max_new_tokens": 4}) | {"retries": {"count": 0}})
    home, port = tmp_path / "mlflow", _free_port()
    home.mkdir()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": url, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "cli", "run", "rl", "-c", "rl.yaml"]
    metrics_file = tmp_path / "runs" / "outage" / "rl" / "metrics.jsonl"

    with _mlflow(home, port) as server:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while _steps_logged(metrics_file) < 3 and proc.poll() is None:
            time.sleep(0.05)
        os.killpg(server.pid, signal.SIGKILL)  # mid-run, without warning
        server.wait()
        killed_at = _steps_logged(metrics_file)
        out, _ = proc.communicate(timeout=600)
    assert 3 <= killed_at < STEPS, f"the server was killed after step {killed_at}, not mid-run"
    assert proc.returncode == 1, out[-3000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "run `hindsight sync" in errors[0] and "the MLflow server was unreachable" in errors[0]
    assert _steps_logged(metrics_file) == STEPS + 1  # training went on to the end (row 0: the first eval)
    spool = tmp_path / "runs" / "outage" / "mlflow-spool" / "ops.jsonl"
    assert spool.exists()

    with _mlflow(home, port):
        synced = subprocess.run([sys.executable, "-m", "cli", "sync", "runs/outage"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        assert synced.returncode == 0, synced.stderr[-3000:]
        assert "registered outage-policy v1" in synced.stdout
        again = subprocess.run([sys.executable, "-m", "cli", "sync", "runs/outage"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300)
        assert "nothing spooled" in again.stdout  # a second sync sends nothing twice

        client = MlflowClient(url, registry_uri=url)
        mv = client.get_model_version_by_alias("outage-policy", "latest")
        run = client.get_run(mv.run_id)
        assert run.info.status == "FINISHED"
        local = [json.loads(line) for line in metrics_file.read_text().splitlines()]
        for key in ("reward/mean", "policy/loss", "runtime/lr"):
            history = client.get_metric_history(run.info.run_id, key)
            want = {row["step"]: row[key] for row in local if key in row}
            assert sorted({m.step for m in history}) == sorted(want) == list(range(1, STEPS + 1)), key
            assert all(abs(m.value - want[m.step]) < 1e-9 for m in history), key
        assert {"reports", "plots"} <= {f.path for f in client.list_artifacts(run.info.run_id)}
        _every_trace_arrived(url, run, tmp_path / "runs" / "outage" / "rl")

        rerun = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "outage-policy v1" in rerun.stdout  # the cached stage, with the version sync registered


def _every_trace_arrived(url: str, run, rl_dir: Path) -> None:
    """The traces written before the kill and those spooled after it: 8 a step (of 16 samples),
    and every eval answer, each with its stored reward as feedback, none twice."""
    import mlflow
    import pyarrow.parquet as pq

    mlflow.set_tracking_uri(url)
    traces = mlflow.search_traces(locations=[run.info.experiment_id], run_id=run.info.run_id, return_type="list",
                                  max_results=1000)
    train = [t for t in traces if t.info.tags["hindsight.kind"] == "train"]
    answers = sum(len(json.loads(p.read_text())["answers"]) for p in (rl_dir / "evals").glob("*.json"))
    assert len(train) == STEPS * 8 and len(traces) - len(train) == answers, (len(train), len(traces), answers)
    assert len({t.info.trace_id for t in traces}) == len(traces)
    for t in train:
        step, index = int(t.info.tags["hindsight.step"]), int(t.info.tags["hindsight.index"])
        scores = pq.read_table(rl_dir / f"scores/step-{step:06d}.parquet").to_pylist()
        feedback = {a.name: a.value for a in t.info.assessments}
        assert feedback["reward"] == next(s["reward"] for s in scores if s["index"] == index)
