"""The Python API, `hindsight.run`, as a user calls it:

- from a script with no `if __name__ == "__main__":` guard and no PREFECT_API_URL: it starts
  the shared local Prefect server itself, and the reward worker (process isolation) does not
  re-import the script, which would start the training a second time;
- from a notebook-style caller: code with no `__main__` file, called while an asyncio event loop
  runs (as in a Jupyter cell);
- a bad config is raised as hindsight's ConfigError, naming the file and line.
"""
import os
import subprocess
import sys
from pathlib import Path

from tests.configs import rl_only, write

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import hindsight
print("SCRIPT STARTED", flush=True)  # once: the reward worker must not run this file again
result = hindsight.run("rl", "api.yaml", overrides=["rl.steps=2"])
print("RESULT", result.model, result.version, round(result.eval_accuracy, 3), flush=True)
"""

NOTEBOOK = """
import asyncio
import hindsight
from hindsight.errors import ConfigError

async def cell():  # Jupyter runs a cell's code while its event loop is running
    return hindsight.run("rl", "api.yaml")

result = asyncio.run(cell())
print("RESULT", result.model, result.version, flush=True)
try:
    hindsight.run("rl", "broken.yaml")
except ConfigError as exc:
    print("ERROR", exc, flush=True)
"""


def _env(tmp_path, **extra):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": str(ROOT), **extra}
    return env


def test_a_script_without_a_main_guard_or_a_server(tiny_init, tmp_path):
    work, init = tiny_init
    write(tmp_path / "api.yaml", rl_only("api", work / "data", init, scoring={"isolation": "process"}))
    (tmp_path / "train.py").write_text(SCRIPT)
    env = _env(tmp_path, PREFECT_HOME=str(tmp_path / "prefect-home"))
    env.pop("PREFECT_API_URL", None)
    try:
        res = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=900)
    finally:
        subprocess.run([sys.executable, "-m", "cli", "server", "stop"], cwd=tmp_path, env=env, capture_output=True)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.stdout.count("SCRIPT STARTED") == 1, res.stdout[-2000:]
    assert "RESULT api-policy 1 " in res.stdout, res.stdout[-2000:]
    assert "started a local Prefect server at http://127.0.0.1:" in res.stderr


def test_a_notebook_style_call_and_a_bad_config(tiny_init, tmp_path):
    work, init = tiny_init
    write(tmp_path / "api.yaml", rl_only("nb", work / "data", init))
    (tmp_path / "broken.yaml").write_text("name: nb\nrl:\n  stepz: 2\n")  # a mistyped key
    res = subprocess.run([sys.executable, "-c", NOTEBOOK], cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "RESULT nb-policy 1" in res.stdout, res.stdout[-2000:]
    error = next(line for line in res.stdout.splitlines() if line.startswith("ERROR"))
    assert "broken.yaml:3:" in error and "rl.stepz" in error, error
