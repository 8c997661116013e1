"""A cached rerun loads every stage's flow and trains nothing: those imports, the config and the
model resolver stay free of torch and transformers (seconds each at every command's start,
bench/cached_rerun.py). A module-level `import torch` added on that path fails here."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE = """
import sys
import flows.pipeline, flows.sft, flows.reward_model, flows.rl, flows.negative_ft, flows.sweep
from hindsight.config import load_config
from hindsight.models.source import resolve_model_source
load_config('configs/demo.yaml', ['rl.learner.strategy=fsdp2'])
heavy = sorted(m for m in ('torch', 'transformers', 'trl', 'peft') if m in sys.modules)
print(' '.join(heavy) or 'none')
"""


def test_the_cached_rerun_path_imports_no_torch():
    res = subprocess.run([sys.executable, "-c", CODE], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(Path.home())})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "none"
