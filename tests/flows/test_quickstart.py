"""The README's quickstart runs as written: its bash block, in a fresh folder, ends with a
registered policy and a report the README's next command can rebuild."""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_quickstart_runs_as_written(tmp_path):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quickstart"):readme.index("## Commands")]
    script = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    bindir = tmp_path / "bin"  # `hindsight` as the console script would run it, from this checkout
    bindir.mkdir()
    (bindir / "hindsight").write_text(f"#!/bin/sh\nexec {sys.executable} -m cli \"$@\"\n")
    (bindir / "hindsight").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)  # the quickstart's own store, in its folder
    res = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "myproj-policy v1" in res.stdout
    report = subprocess.run(["hindsight", "report", "runs/myproj", "--step", "5"], cwd=tmp_path / "myproj", env=env,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0 and (tmp_path / "myproj/runs/myproj/rl/reports/step-000005.html").exists()
