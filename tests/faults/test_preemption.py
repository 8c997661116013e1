"""SIGTERM to `hindsight run rl` mid-run: the step in flight finishes, a checkpoint of it is
written, the command exits 143 with one line saying how to resume, and the rerun ends allclose
to an uninterrupted run. A second signal exits at once, and the last complete checkpoint stands."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from hindsight.models.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[2]
STEPS = 8
CONFIG = """
name: preempt
seed: 0
model: {{base: tiny://demo}}
sft: {{enabled: false}}
reward_model: {{enabled: false}}
rl:
  init: {init}
  steps: {steps}
  prompts_per_step: 4
  samples_per_prompt: 4
  learner: {{lr: 1.0e-3}}
  kl: {{coef: 0.02}}
  rollout: {{max_new_tokens: 4}}
  eval_every: 100
  save_every: 100
  scoring: {{rewards: [{{fn: "rewards.format:number_only"}}]}}
eval: {{limit: 8, max_new_tokens: 4}}
retries: {{count: 0}}
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    work = tmp_path_factory.mktemp("preempt")
    init = build_tiny_model(work / "init", hidden=32, layers=1, heads=2)
    (work / "rl.yaml").write_text(CONFIG.format(init=init, steps=STEPS))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("HINDSIGHT_FAULT", None)
    ref = _start(work, env, "reference")
    assert ref.wait(timeout=600) == 0
    return work, env


def _start(work, env, run_dir):
    log = open(work / f"{run_dir}.log", "a")
    return subprocess.Popen([sys.executable, "-m", "cli", "run", "rl", "-c", "rl.yaml", "--set", f"run_dir=runs/{run_dir}"],
                            cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)


def _steps_done(work, run_dir) -> int:
    try:
        return len((work / "runs" / run_dir / "rl" / "metrics.jsonl").read_text().splitlines())
    except FileNotFoundError:
        return 0


def _wait_for_step(work, proc, run_dir, n):
    while _steps_done(work, run_dir) < n:
        assert proc.poll() is None, (work / f"{run_dir}.log").read_text()[-3000:]
        time.sleep(0.05)


def _final(work, run_dir, steps=STEPS):
    return load_file(work / "runs" / run_dir / "rl" / "checkpoints" / "policy" / f"step-{steps:06d}" / "model.safetensors")


def test_sigterm_checkpoints_the_step_in_flight_and_the_rerun_ends_allclose(workspace):
    work, env = workspace
    proc = _start(work, env, "term")
    _wait_for_step(work, proc, "term", 2)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=300)  # a hang here fails the test: the grace period is the step in flight
    log = (work / "term.log").read_text()
    assert rc == 143, log[-3000:]
    lines = [line for line in log.splitlines() if line.startswith("preempted:")]
    assert len(lines) == 1 and "rerun the same command to resume" in lines[0], log[-3000:]
    done = int(lines[0].split("after step ")[1].split()[0])
    assert 2 <= done < STEPS
    manifest = json.loads((work / "runs/term/rl/checkpoints/manifest.json").read_text())
    assert manifest["step"] == done  # a checkpoint of the step it was in, off the save_every schedule
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("hindsight").experiment_id],
                              filter_string="tags.`hindsight.stage` = 'rl'", order_by=["attributes.start_time DESC"])
    assert runs[0].info.status == "KILLED"

    rerun = _start(work, env, "term")
    assert rerun.wait(timeout=600) == 0, (work / "term.log").read_text()[-3000:]
    assert f"resuming rl from step {done}" in (work / "term.log").read_text()
    ref, got = _final(work, "reference"), _final(work, "term")
    assert max((ref[k] - got[k]).abs().max().item() for k in ref) < 1e-5


def test_a_second_signal_exits_at_once_and_the_last_checkpoint_stands(workspace):
    """The signals land while the run starts (its models loaded, the first evaluation not yet
    done): the guard holds from the first model load, not only around the steps."""
    work, env = workspace
    proc = _start(work, env, "twice")
    started = work / "runs" / "twice" / "rl" / "mlflow_run_ids"  # written once the models are loaded
    while not started.exists():
        assert proc.poll() is None, (work / "twice.log").read_text()[-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=300)
    assert rc == 128 + signal.SIGTERM, (work / "twice.log").read_text()[-3000:]
    rerun = _start(work, env, "twice")
    assert rerun.wait(timeout=600) == 0, (work / "twice.log").read_text()[-3000:]
    ref, got = _final(work, "reference"), _final(work, "twice")
    assert max((ref[k] - got[k]).abs().max().item() for k in ref) < 1e-5
    assert torch.isfinite(next(iter(got.values()))).all()


def test_sigterm_in_a_ray_learner_group_checkpoints_and_resumes(workspace):
    """The same with two learner ranks on Ray (rank 1 an actor): the signal reaches the stage's
    process, the step in flight finishes on both ranks, rank 0 writes the checkpoint. The rerun is
    compared with an uninterrupted group of two: the same ranks sum the same gradients in the same
    order, so what differs would be the preemption's. (A group of two against one process differs
    by float summation order, which Adam's first steps amplify on gradients at its eps; that
    claim is tests/roles/test_learner_group.py's, at its own tolerance.)"""
    work, env = workspace
    # 4 steps, not 8: the signal still lands mid-run (after step 2) with steps left to resume
    (work / "group.yaml").write_text((work / "rl.yaml").read_text().replace(
        "  save_every: 100\n", "  save_every: 100\n  workers: {placement: ray}\n").replace(
        "  learner: {lr: 1.0e-3}\n", "  learner: {lr: 1.0e-3, processes: 2}\n").replace(
        f"  steps: {STEPS}\n", "  steps: 4\n"))
    whole = subprocess.Popen([sys.executable, "-m", "cli", "run", "rl", "-c", "group.yaml", "--set",
                              "run_dir=runs/group-reference"], cwd=work, env=env,
                             stdout=open(work / "group-reference.log", "a"), stderr=subprocess.STDOUT)
    assert whole.wait(timeout=600) == 0, (work / "group-reference.log").read_text()[-3000:]
    proc = subprocess.Popen([sys.executable, "-m", "cli", "run", "rl", "-c", "group.yaml", "--set", "run_dir=runs/group"],
                            cwd=work, env=env, stdout=open(work / "group.log", "a"), stderr=subprocess.STDOUT)
    _wait_for_step(work, proc, "group", 2)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=300)
    log = (work / "group.log").read_text()
    assert rc == 143 and "preempted: " in log, log[-3000:]
    rerun = subprocess.Popen([sys.executable, "-m", "cli", "run", "rl", "-c", "group.yaml", "--set", "run_dir=runs/group"],
                             cwd=work, env=env, stdout=open(work / "group.log", "a"), stderr=subprocess.STDOUT)
    assert rerun.wait(timeout=600) == 0, (work / "group.log").read_text()[-3000:]
    ref, got = _final(work, "group-reference", 4), _final(work, "group", 4)
    assert max((ref[k] - got[k]).abs().max().item() for k in ref) < 1e-5
