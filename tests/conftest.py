import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")


import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_api(tmp_path_factory):
    """A real `prefect server start` on loopback for the session; yields its API URL.

    Tests point CLI subprocesses at it (PREFECT_API_URL), so each command skips starting
    a temporary server of its own. Stopped by its process id at the end.
    """
    home = tmp_path_factory.mktemp("prefect-server")
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    log = open(home / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited: {(home / 'server.log').read_text()[-2000:]}")
            time.sleep(0.5)
    else:
        proc.kill()
        raise RuntimeError("prefect server did not become healthy in 90 s")
    yield url
    os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
    log.close()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]
