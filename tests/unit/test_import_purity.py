"""hindsight/ and rewards/ must import without prefect, mlflow or vllm (checked in a clean interpreter)."""
import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_core_imports_without_orchestration_libraries():
    import hindsight
    import rewards

    modules = [m.name for pkg in (hindsight, rewards) for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    assert "hindsight.rl" in modules and "rewards.math" in modules
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'prefect', 'mlflow', 'vllm'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
