"""docs/deploy.md's local-pool section, run as written: its shell blocks in order, the worker's
block in the background as its own terminal, against a fresh PREFECT_HOME, ending in a
Completed flow run that the worker picked up, with the stage runs and the registered policy in
MLflow and the run in HINDSIGHT_WORKDIR. Only the port differs (a free one instead of 4200)."""
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]


def local_pool_blocks() -> list[str]:
    text = (ROOT / "docs/deploy.md").read_text()
    section = text.split("## 2. Local: a process work pool", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)```", section, re.DOTALL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_local_pool_section_runs_as_written(tmp_path):
    blocks = local_pool_blocks()
    assert len(blocks) == 3 and "terminal 2" in blocks[1], blocks
    port = str(_free_port())
    blocks = [b.replace("4200", port) for b in blocks]
    repo = tmp_path / "repo"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)  # the docs' $PWD: a checkout
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI",
                                                            "HINDSIGHT_WORKDIR")}
    env.update({"PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONPATH": str(repo),
                "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "2",
                "PATH": f"{Path(os.sys.executable).parent}:{env['PATH']}"})
    bash = lambda script, **kw: ["bash", "-euo", "pipefail", "-c", script]  # noqa: E731
    worker = None
    try:
        first = subprocess.run(bash(blocks[0]), cwd=repo, env=env, capture_output=True, text=True, timeout=600)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        with open(tmp_path / "worker.log", "w") as log:
            worker = subprocess.Popen(bash(blocks[1]), cwd=repo, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        run = subprocess.run(bash(_exports(blocks[0]) + blocks[2]), cwd=repo, env=env, capture_output=True,
                             text=True, timeout=1200)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "Completed" in run.stdout + run.stderr
    finally:
        if worker is not None:
            _stop(worker)
        subprocess.run(["bash", "-c", "hindsight server stop || python -m cli server stop"], cwd=repo, env=env,
                       capture_output=True)
    work = repo / "work"
    assert not (repo / "params.json").exists() and (work / "params.json").exists()  # nothing written into the repo
    client = MlflowClient(f"sqlite:///{work}/mlflow.db")
    assert client.get_model_version_by_alias("smoke-policy", "latest").run_id  # where the docs say the runs go
    runs = client.search_runs([client.get_experiment_by_name("hindsight").experiment_id])
    names = {r.data.tags["hindsight.stage"] for r in runs}
    assert {"pipeline", "sft", "reward-model", "rl"} <= names
    assert "submitting flow run" in (tmp_path / "worker.log").read_text()  # the worker picked it up
    assert (work / "runs/smoke/rl/reports/step-000004.html").exists()  # the flow ran in HINDSIGHT_WORKDIR


def _stop(worker: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL: Prefect's worker catches SIGTERM for a graceful shutdown that has been
    seen to hang past a minute on a loaded machine (CI, once). The flow run this test checks has
    ended by then, and a worker left behind would hold a core through the rest of the suite."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
        try:
            os.killpg(worker.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _group_alive(worker):
            time.sleep(0.2)
        if not _group_alive(worker):
            break
    worker.wait(timeout=30)


def _group_alive(worker: subprocess.Popen) -> bool:
    worker.poll()  # reaps the group's leader once it exits: a zombie would still count as the group
    try:
        os.killpg(worker.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _exports(block: str) -> str:
    """Terminal 1's variables, which its third block (the same terminal) still has."""
    return "".join(line + "\n" for line in block.splitlines() if line.startswith("export "))
