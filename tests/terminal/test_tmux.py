"""In a real terminal (tmux), the RL progress bar stays one bar: the log lines printed while it
runs (an alert, Prefect's logs, checkpoint saves) go above it, not glued to it."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.configs import rl_only, write

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8


def test_one_progress_bar_in_a_tmux_pane(tiny_init, tmp_path):
    assert shutil.which("tmux"), "tmux is needed (.ci/run installs it)"
    work, init = tiny_init
    write(tmp_path / "rl.yaml", rl_only("tty", work / "data", init, steps=STEPS, prompts_per_step=4, samples_per_prompt=4,
                                        eval_every=4, save_every=2, rollout={"max_new_tokens": 4},
                                        alerts=[{"rule": "kl_high", "threshold": -1.0, "action": "warn"}]))
    session = f"hindsight-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TMUX")}
    env.update({"PYTHONPATH": str(ROOT), "TERM": "xterm-256color", "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/m.db"})
    done = tmp_path / "done"
    cmd = f"cd {tmp_path} && {sys.executable} -m cli run rl -c rl.yaml; echo $? > {done}; sleep 600"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "150", "-y", "60", cmd], env=env, check=True)
    try:
        deadline = time.time() + 600
        while not done.exists() and time.time() < deadline:
            time.sleep(0.5)
        pane = subprocess.run(["tmux", "capture-pane", "-p", "-J", "-S", "-1000", "-t", session],
                              capture_output=True, text=True, check=True).stdout
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    assert done.read_text().strip() == "0", pane[-3000:]
    bars = [line for line in pane.splitlines() if "━" in line and "┃" not in line and not line.startswith(("┏", "┡", "└"))]
    assert len(bars) == 1, pane  # a redrawn or broken bar would leave more than one
    assert bars[0].startswith("rl ━") and f"{STEPS}/{STEPS}" in bars[0], bars[0]  # nothing glued in front
    lines = pane.splitlines()
    alert = next(i for i, line in enumerate(lines) if line.startswith("ALERT step 1: kl_high"))
    assert alert < lines.index(bars[0])  # printed while the bar ran, on its own line above it
    assert "Finished in state Completed" not in pane and "LOAD REPORT" not in pane and "Downloading" not in pane
