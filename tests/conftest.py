import os

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")


import socket
from contextlib import contextmanager
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


@contextmanager
def served(cmd: list[str], health_url: str, home: Path, env: dict | None = None, timeout: float = 120):
    """Start a server process, wait for its health endpoint, and stop its process group after."""
    log = open(home / "server.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + timeout
    try:
        while True:
            try:
                urllib.request.urlopen(health_url, timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError(f"{cmd[2]} server exited: {(home / 'server.log').read_text()[-2000:]}") from None
                if time.time() > deadline:
                    raise RuntimeError(f"{cmd[2]} server did not become healthy in {timeout:.0f} s") from None
                time.sleep(0.5)
        yield proc
    finally:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        log.close()


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
    url = f"http://127.0.0.1:{port}/api"
    with served([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                f"{url}/health", home, env):
        yield url


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on loopback (sqlite backend, proxied artifacts); yields (url, its folder)."""
    home = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    with served([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                 "--backend-store-uri", f"sqlite:///{home}/mlflow.db", "--artifacts-destination", str(home / "artifacts"),
                 "--workers", "1"], f"{url}/health", home):
        yield url, home


# the tests of the deprecated-key shim itself, which must write old keys (hindsight/config/legacy.py)
SHIM_TESTS = ("tests/unit/config/test_blocks_by_role.py",)


@pytest.fixture(autouse=True)
def _todays_keys(request):
    """The suite writes today's config keys: a test (outside the shim's own) whose config made
    hindsight log a deprecation line fails, naming the line, so the suite cannot drift onto keys
    that the docs no longer teach. Child processes log elsewhere; their configs come from the same
    helpers."""
    import logging

    lines: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            msg = record.getMessage()
            if " is deprecated: write " in msg:
                lines.append(msg)

    handler, logger = Catch(logging.WARNING), logging.getLogger("hindsight")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if lines and not request.node.nodeid.startswith(SHIM_TESTS):
        pytest.fail(f"this test's config uses deprecated keys (write today's): {sorted(set(lines))}", pytrace=False)


@pytest.fixture(autouse=True)
def _mlflow_uris_stay_put():
    """mlflow.set_tracking_uri / set_registry_uri (called by our tracking client in-process) also
    set MLFLOW_TRACKING_URI / MLFLOW_REGISTRY_URI in os.environ: a later test's subprocesses and
    MlflowClients would follow them to this test's (deleted, or stopped) store."""
    keys = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    before = {k: os.environ.get(k) for k in keys}
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    import sys

    if "mlflow" in sys.modules:  # and the module globals a client without explicit URIs falls back on
        from mlflow.tracking._model_registry import utils as registry_utils
        from mlflow.tracking._tracking_service import utils as tracking_utils

        tracking_utils._tracking_uri, registry_utils._registry_uri = None, None


@pytest.fixture(scope="session", autouse=True)
def _one_prefect_server(request):
    """Integration tests' CLI subprocesses (which copy os.environ) all talk to the session's one
    Prefect server: never a server per command, none left running after the session. Session
    scope, so it is in os.environ before any module fixture copies the environment."""
    if not any(item.get_closest_marker("integration") for item in request.session.items):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_API_URL", request.getfixturevalue("prefect_api"))
        yield


# the longest files, first: xdist's loadfile hands files out in collection order, so one that
# starts last runs alone at the end while the other worker idles
FIRST = ("real_model",)


def pytest_collection_modifyitems(config, items):
    """Every test outside tests/unit/ (which mirrors the packages) starts the CLI, a server, a
    browser or another process, or waits on a clock: the `integration` tier. A new top-level
    folder is integration by default (tests/judge was missed by an explicit list)."""
    for item in items:
        parts = Path(item.path).relative_to(Path(__file__).parent).parts
        if len(parts) > 1 and parts[0] != "unit":
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: Path(item.path).relative_to(Path(__file__).parent).parts[0] not in FIRST)


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    """(a folder with the demo data under data/, a tiny model's path) for RL tests on this module's runs."""
    from hindsight.data.demo import build_demo_data
    from hindsight.models.tiny import build_tiny_model

    work = tmp_path_factory.mktemp("tiny")
    build_demo_data(work / "data", seed=0)
    return work, str(build_tiny_model(work / "init", hidden=32, layers=1, heads=2))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parents[1]


def pytest_terminal_summary(terminalreporter):
    """What a test measured and asked to be shown (`record_property("fuzz", ...)`): the fuzz
    counts, in the run's output with or without xdist (properties travel with the reports)."""
    lines = [value for report in terminalreporter.stats.get("passed", [])
             for name, value in getattr(report, "user_properties", []) if name == "fuzz"]
    if lines:
        terminalreporter.write_sep("-", "fuzzed")
        for line in lines:
            terminalreporter.write_line(line)
