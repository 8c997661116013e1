"""The layers are import-linter contracts (pyproject.toml, `make lint`): the tree keeps them, and
one forbidden import added to a copy of it breaks the contract that names it. No two modules
import each other, even lazily: a check on import-linter's own graph (grimp) finds every circle."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hindsight import PACKAGES

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_list_is_kept_in_one_place():
    """hindsight.PACKAGES is the list; pyproject.toml's packaging and import-linter read the same."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(project["tool"]["importlinter"]["root_packages"]) == set(PACKAGES)
    assert sorted(p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]) == sorted(PACKAGES)


def _lint(root: Path) -> subprocess.CompletedProcess:
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root,
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_the_tree_keeps_every_contract():
    res = _lint(ROOT)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "7 kept, 0 broken" in res.stdout


LAYERS = "shared leaves under all BROKEN"


@pytest.mark.parametrize("module, line, broken", [
    ("hindsight/state/store.py", "import mlflow", "mlflow only in tracking BROKEN"),
    ("hindsight/state/store.py", "from hindsight.coordination.run import RLRun", LAYERS),
    ("hindsight/learning/update.py", "import ray", "ray only in the placement module BROKEN"),
    ("tasks/rl.py", "import flows.rl", "(hindsight, rewards) BROKEN"),
    ("hindsight/config/data.py", "from hindsight.rollout import worker", "never a role BROKEN"),
    # the config sits above the roles: a role reads its block, never the schema
    ("hindsight/learning/update.py", "from hindsight.config import PipelineConfig", LAYERS),
    ("hindsight/scoring/scorer.py", "import hindsight.config.rl", LAYERS),
    # a shared leaf never reaches up, and state and transport are independent
    ("hindsight/models/load.py", "from hindsight.rollout import worker", LAYERS),
    ("hindsight/transport/base.py", "import hindsight.state.store", LAYERS),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module, line, broken):
    _copy_tree(tmp_path)
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}  # noqa\n")
    res = _lint(tmp_path)
    assert res.returncode != 0, res.stdout[-3000:]
    assert broken in res.stdout.replace("\n", " "), res.stdout[-3000:]


def _copy_tree(to: Path) -> None:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, to / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", to / "pyproject.toml")


def import_circles(root: Path) -> list[list[str]]:
    """Every set of modules that import each other, directly or through others (the strongly
    connected components of grimp's graph of the packages), in a subprocess rooted at `root`."""
    code = """
import json, sys
import grimp
g = grimp.build_graph(*sys.argv[1:])
adj = {m: sorted(g.find_modules_directly_imported_by(m) & g.modules) for m in g.modules}
index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
    for w in adj[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            out.append(sorted(comp))
sys.setrecursionlimit(10000)
for m in sorted(g.modules):
    if m not in index:
        visit(m)
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code, *PACKAGES], cwd=root, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def test_no_two_modules_import_each_other():
    assert import_circles(ROOT) == []


def test_a_planted_circle_is_found(tmp_path):
    _copy_tree(tmp_path)
    target = tmp_path / "hindsight/rollout/decoding.py"  # the worker imports decoding; now the reverse too
    target.write_text(target.read_text() + "\n\ndef _late():\n    from hindsight.rollout import worker  # noqa\n")
    circles = import_circles(tmp_path)
    assert any({"hindsight.rollout.decoding", "hindsight.rollout.worker"} <= set(c) for c in circles), circles


def test_every_core_module_sits_in_a_layer():
    """A module left out of the core's layers contract is checked by nothing (packing once was)."""
    import re
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    core = next(c for c in contracts if c["type"] == "layers" and any("hindsight.config" in x for x in c["layers"]))
    named = {m for layer in core["layers"] for m in re.split(r"[|:]", layer) for m in [m.strip()] if m}
    modules = {f"hindsight.{p.stem}" for p in (ROOT / "hindsight").glob("*.py") if p.stem != "__init__"} | \
              {f"hindsight.{p.parent.name}" for p in (ROOT / "hindsight").glob("*/__init__.py")}
    assert sorted(modules - named) == []
