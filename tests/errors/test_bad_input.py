"""Every row of docs/errors.md through the real CLI (a process of its own, against a real Prefect
server and an MLflow sqlite store): exit 1, one `error:` line holding the documented
message, no traceback, no registered model, and no partial state on disk.

A case with no environment variables of its own runs `python -m cli` as a child forked from a
process that has already imported the CLI's libraries (`forkcli.py`): the same code from the
same argv, without ~3-5 s of imports a case. The rest, and the workspace's reference run, start
`python -m cli` from scratch."""
from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient
from hindsight.data.demo import build_demo_data
from hindsight.models.tiny import build_tiny_model
from error_cases import CASES, base_config, rl_args, write_config

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([a-z0-9-]+)` \| .+ \| `(.+)` \|$")


def documented() -> dict[str, str]:
    rows = [ROW.match(line) for line in (ROOT / "docs/errors.md").read_text().splitlines()]
    return {m.group(1): m.group(2) for m in rows if m}


def _hindsight(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


class ForkedCli:
    """Runs `python -m cli ARGS` as a child of the warm server (forkcli.py): one at a time."""

    def __init__(self, env: dict):
        self.env, self.io = env, Path(tempfile.mkdtemp(prefix="forkcli-"))  # outside the case's folder
        self.server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("forkcli.py"))], env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.pending = b""  # what was read of the answers past the last whole line

    def run(self, args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
        out, err = self.io / "out", self.io / "err"
        self.server.stdin.write(json.dumps({"args": args, "cwd": str(cwd), "env": self.env, "out": str(out),
                                            "err": str(err)}) + "\n")
        self.server.stdin.flush()
        pid = json.loads(self._line(300))["pid"]  # the first waits for the server's imports
        try:
            rc = json.loads(self._line(timeout))["rc"]
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            self._line(60)  # the killed child's status: the next case must not read it as its own
            raise
        return subprocess.CompletedProcess(["python", "-m", "cli", *args], rc, out.read_text(), err.read_text())

    def _line(self, timeout: float) -> str:
        """The next answer line, read from the pipe itself (a buffered reader would hide a line
        it already holds from `select`)."""
        fd = self.server.stdout.fileno()
        while b"\n" not in self.pending:
            if not select.select([fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("forkcli", timeout)
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"forkcli.py exited ({self.server.wait()}); its stderr is above")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=30)
        shutil.rmtree(self.io, ignore_errors=True)


@pytest.fixture(scope="module")
def ws(tmp_path_factory, prefect_api):
    work = tmp_path_factory.mktemp("errors")
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
           "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("HINDSIGHT_FAULT", None)
    space = SimpleNamespace(root=ROOT, tmp=work, env=env, data=work / "data", done_run=work / "done",
                            init=build_tiny_model(work / "init", hidden=32, layers=1, heads=2))
    build_demo_data(space.data, seed=0)
    done = _hindsight(rl_args(write_config(work, base_config(space, space.done_run))), work, env)
    assert done.returncode == 0, done.stderr[-3000:]
    space.forked = ForkedCli(env)
    yield space
    space.forked.close()


def _files(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def _runs(uri: str) -> int:
    client = MlflowClient(uri)
    return sum(len(client.search_runs([e.experiment_id], max_results=50000)) for e in client.search_experiments())


def _versions(uri: str) -> int:
    client = MlflowClient(uri, registry_uri=uri)
    return sum(len(client.search_model_versions(f"name='{m.name}'")) for m in client.search_registered_models())


def test_every_documented_row_has_a_case():
    assert documented().keys() == CASES.keys()
    assert len(CASES) >= 20


@pytest.mark.parametrize("row", sorted(CASES))
def test_bad_input_gives_one_clear_error_and_no_partial_state(row, ws, tmp_path, monkeypatch):
    expected = documented()[row]
    c = CASES[row](ws, tmp_path)
    env = {**ws.env, **c.env}
    if "PYTHONPATH" in c.env:
        env["PYTHONPATH"] = f"{c.env['PYTHONPATH']}:{ws.env['PYTHONPATH']}"
    uri = ws.env["MLFLOW_TRACKING_URI"]
    before, versions, runs = _files(tmp_path), _versions(uri), _runs(uri) if c.starts_no_run else None

    t0 = time.perf_counter()
    result = ws.forked.run(c.args, tmp_path) if not c.env else _hindsight(c.args, tmp_path, env)
    print(f"time to the error: {row}: {time.perf_counter() - t0:.1f} s")  # reported, never asserted (-s shows it)

    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 1, result.stderr[-3000:]
    assert len(errors) == 1, result.stderr[-3000:]
    assert expected in errors[0], errors[0]
    said = result.stdout + result.stderr
    assert said.count(expected) == 1, said[-3000:]  # printed once, not again by each task and flow it failed
    assert "Traceback" not in said
    assert _versions(uri) == versions
    if c.starts_no_run:
        assert _runs(uri) == runs, "an MLflow run was started before the refusal"
    _assert_no_partial_state(tmp_path, before, c.keeps_state)


def _assert_no_partial_state(root: Path, before: dict, keeps_state: bool) -> None:
    after = _files(root)
    assert not [p for p in after if ".tmp" in p and p not in before], "a temporary file survived"
    assert before.keys() <= after.keys(), "an input file was removed"
    changed = [p for p in after if before.get(p) != after[p]]
    if not keeps_state:
        assert changed == [], changed
        return
    for p in changed:  # what a failure after sampling keeps must be complete and readable
        if p.endswith(".parquet"):
            assert pq.read_table(root / p).num_rows > 0

