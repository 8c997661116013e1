"""One local Prefect server: two commands started at once with none running start exactly one
and both complete; `hindsight server status|stop` see it; a server that cannot start is one
`error:` line with the remedy."""
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.configs import rl_only, write

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PYTHONPATH": str(ROOT),
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    env.pop("PREFECT_API_URL", None)  # no server given: the command must find or start the local one
    return env


def _cli(args, tmp_path, env, **kw):
    return subprocess.Popen([sys.executable, "-m", "cli", *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_two_pipelines_started_at_once_share_one_local_server(tiny_init, tmp_path):
    work, init = tiny_init
    env = _env(tmp_path)
    for name in ("one", "two"):
        write(tmp_path / f"{name}.yaml", rl_only(name, work / "data", init))
    try:
        procs = [_cli(["run", "pipeline", "-c", f"{name}.yaml"], tmp_path, env) for name in ("one", "two")]
        outs = [p.communicate(timeout=900) for p in procs]
        for p, (_out, err) in zip(procs, outs):
            assert p.returncode == 0, err[-3000:]
        started = sum(err.count("started a local Prefect server at") for _, err in outs)
        assert started == 1, [err[-2000:] for _, err in outs]
        status = subprocess.run([sys.executable, "-m", "cli", "server", "status"], cwd=tmp_path, env=env,
                                capture_output=True, text=True)
        assert status.returncode == 0 and "Prefect server at http://127.0.0.1:" in status.stdout
        again = subprocess.run([sys.executable, "-m", "cli", "run", "rl", "-c", "one.yaml"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=600)
        assert again.returncode == 0 and "started a local Prefect server" not in again.stderr  # reused
    finally:
        stop = subprocess.run([sys.executable, "-m", "cli", "server", "stop"], cwd=tmp_path, env=env,
                              capture_output=True, text=True)
    assert "stopped the Prefect server" in stop.stdout
    after = subprocess.run([sys.executable, "-m", "cli", "server", "status"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
    assert after.returncode == 1


def test_a_server_that_cannot_start_is_one_error_line(tmp_path):
    env = _env(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "cli", "server", "start", "--port", str(port)], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 1 and len(errors) == 1, res.stderr[-3000:]
    assert "the local Prefect server" in errors[0] and "retry `hindsight server start`" in errors[0]
    assert "Traceback" not in res.stderr
