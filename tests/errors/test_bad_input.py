"""Every row of docs/errors.md through the real CLI (a subprocess, against a real Prefect
server and an MLflow sqlite store): exit 1, one `error:` line holding the documented
message, no traceback, no registered model, and no partial state on disk."""
from __future__ import annotations

import os
import re
import subprocess
import sys
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
    return space


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

    result = _hindsight(c.args, tmp_path, env)

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

