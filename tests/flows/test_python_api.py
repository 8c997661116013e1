"""The Python API, `hindsight.run`, as a user calls it:

- from a script with no `if __name__ == "__main__":` guard and no PREFECT_API_URL: it starts
  the shared local Prefect server itself, and the reward worker (process isolation) does not
  re-import the script, which would start the training a second time;
- from a notebook: cells run by a real Jupyter kernel (ipykernel, driven by nbclient), whose
  `__main__` is no file and whose event loop is running while a cell runs;
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

CELLS = [
    "import hindsight\nfrom hindsight.errors import ConfigError",
    'result = hindsight.run("rl", "api.yaml")\nprint("RESULT", result.model, result.version)',
    'try:\n    hindsight.run("rl", "broken.yaml")\nexcept ConfigError as exc:\n    print("ERROR", exc)',
]


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


def test_a_notebook_and_a_bad_config(tiny_init, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    work, init = tiny_init
    write(tmp_path / "api.yaml", rl_only("nb", work / "data", init))
    (tmp_path / "broken.yaml").write_text("name: nb\nrl:\n  stepz: 2\n")  # a mistyped key
    for key, value in _env(tmp_path).items():  # the kernel inherits the test's environment
        monkeypatch.setenv(key, value)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    out = "".join(o.get("text", "") for cell in nb.cells for o in cell.outputs if o.output_type == "stream")
    assert "RESULT nb-policy 1" in out, out[-3000:]
    error = next(line for line in out.splitlines() if line.startswith("ERROR"))
    assert "broken.yaml:3:" in error and "rl.stepz" in error, error
