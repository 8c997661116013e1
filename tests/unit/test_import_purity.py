"""hindsight/ and rewards/ must import without prefect, mlflow or vllm, and nothing from the layers
above them (cli -> flows -> tasks -> core): checked in a clean interpreter and in the source."""
import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UPPER = {"cli", "flows", "tasks"}


@pytest.mark.integration  # a fresh interpreter importing every module: a few seconds
def test_core_imports_without_orchestration_libraries():
    import hindsight
    import rewards

    modules = [m.name for pkg in (hindsight, rewards) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    assert "hindsight.coordination.run" in modules and "rewards.math" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'prefect', 'mlflow', 'vllm', 'cli', 'flows', 'tasks'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_source_never_imports_the_layers_above_it():
    offenders = {str(p.relative_to(ROOT)): sorted(_imported_roots(p) & UPPER)
                 for pkg in ("hindsight", "rewards") for p in (ROOT / pkg).rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}
    assert not (ROOT / "hindsight" / "cli.py").exists()


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from flows import registry\n")
    assert _imported_roots(bad) & UPPER == {"flows"}
