"""One local Prefect server: two commands started at once with none running start exactly one
and both complete; `hindsight server status|stop` see it; with the default port taken, the UI it
serves and the links the runs print point at that server; a server that cannot start is one
`error:` line with the remedy."""
import json
import os
import re
import socket
import urllib.request
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


def _take_first_free_port() -> socket.socket:
    """Hold the first free port from 4200, where the server would go, as another Prefect would."""
    for port in range(4200, 4250):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        s.listen(1)
        return s
    raise RuntimeError("no free port in 4200..4249")


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_two_pipelines_started_at_once_share_one_local_server(tiny_init, tmp_path):
    work, init = tiny_init
    env = _env(tmp_path)
    for name in ("one", "two"):
        write(tmp_path / f"{name}.yaml", rl_only(name, work / "data", init))
    taken = _take_first_free_port()
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
        api = re.search(r"Prefect server at (http://127\.0\.0\.1:(\d+)/api)", status.stdout)
        assert int(api.group(2)) != taken.getsockname()[1]
        # the UI asks its own server for data, and a printed link opens a run that server holds
        assert _get(f"{api.group(1).removesuffix('/api')}/ui-settings")["api_url"] == api.group(1)
        link = re.search(r"View at (http://[^/]+)/runs/flow-run/([0-9a-f-]{36})", again.stdout + again.stderr)
        assert link and link.group(1) == api.group(1).removesuffix("/api"), (again.stdout + again.stderr)[-2000:]
        assert _get(f"{api.group(1)}/flow_runs/{link.group(2)}")["name"]
    finally:
        taken.close()
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
