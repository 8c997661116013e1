"""The layers are import-linter contracts (pyproject.toml, `make lint`): the tree keeps them, and
one forbidden import added to a copy of it breaks the contract that names it."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hindsight", "rewards", "tracking", "tasks", "flows", "cli")


def _lint(root: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_the_tree_keeps_every_contract():
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "7 kept, 0 broken" in res.stdout


@pytest.mark.parametrize("module, line, broken", [
    ("hindsight/state/store.py", "import mlflow", "mlflow only in tracking BROKEN"),
    ("hindsight/state/store.py", "from hindsight.coordination.run import RLRun", "state BROKEN"),
    ("hindsight/learning/update.py", "import ray", "ray only in the placement module BROKEN"),
    ("tasks/rl.py", "import flows.rl", "(hindsight, rewards) BROKEN"),
    ("hindsight/config/data.py", "from hindsight.rollout import worker", "never a role BROKEN"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, broken):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    res = _lint(tmp_path)
    assert res.returncode != 0, res.stdout[-3000:]
    assert broken in res.stdout.replace("\n", " "), res.stdout[-3000:]
