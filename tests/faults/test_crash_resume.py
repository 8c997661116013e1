"""SIGKILL the RL command at each phase, rerun the same command, and check nothing was lost.

For every crash point: the rerun completes, the rollout store holds each step's shard
exactly once, and the final weights equal an uninterrupted run's.
"""
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from hindsight.models.tiny import build_tiny_model
from helpers import run_rl_killable

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
CONFIG = """
name: faults
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
  save_every: 2
eval: {{limit: 8, max_new_tokens: 4}}
retries: {{count: 0}}
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    work = tmp_path_factory.mktemp("faults")
    init = build_tiny_model(work / "init", hidden=32, layers=1, heads=2)
    (work / "rl.yaml").write_text(CONFIG.format(init=init, steps=STEPS))
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "PYTHONPATH": str(ROOT),
           "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("HINDSIGHT_FAULT", None)
    reference = _run(work, env, "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]
    return work, env


def _run(work, env, run_dir, fault=None):
    return run_rl_killable(work, env, "rl.yaml", run_dir, fault)


def _weights(work, run_dir):
    return load_file(work / "runs" / run_dir / "rl" / "checkpoints" / "policy" / f"step-{STEPS:06d}" /
                     "model.safetensors")


def _assert_store_complete(work, run_dir):
    rl = work / "runs" / run_dir / "rl"
    for comp in ("rollouts", "scores"):
        files = sorted(p.name for p in (rl / comp).iterdir())
        shards = [f"step-{s + 1:06d}.parquet" for s in range(STEPS)]  # numbered from 1
        assert files == sorted(shards + [f"{n}.sha256" for n in shards]), files  # no gap, no duplicate, no temp
        for s in range(STEPS):
            assert set(pq.read_table(rl / comp / f"step-{s + 1:06d}.parquet").column("step").to_pylist()) == {s}


@pytest.mark.parametrize("fault", ["rollout:3", "score:3", "update:3", "checkpoint:4"])
def test_sigkill_then_rerun_matches_uninterrupted_run(workspace, fault):
    work, env = workspace
    run_dir = "crash-" + fault.replace(":", "-")
    crashed = _run(work, env, run_dir, fault)
    assert crashed.returncode == -9  # really killed, not a clean exit
    resumed = _run(work, env, run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _assert_store_complete(work, run_dir)
    ref, got = _weights(work, "reference"), _weights(work, run_dir)
    assert ref.keys() == got.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-5, rtol=0)


def test_resume_trains_on_shards_newer_than_the_weights(workspace):
    """The seed's case: weights at step 2, rollouts stored to step 3; the resume reuses them."""
    work, env = workspace
    crashed = _run(work, env, "seed-case", "update:3")
    assert crashed.returncode == -9
    rl = work / "runs" / "seed-case" / "rl"
    assert (rl / "checkpoints" / "manifest.json").read_text().count('"step": 2') == 1
    stored = {s: (rl / "rollouts" / f"step-{s + 1:06d}.parquet").stat().st_ino for s in (2, 3)}
    assert _run(work, env, "seed-case").returncode == 0
    # the same files (same inodes): steps 2 and 3 were trained on, not sampled again
    assert {s: (rl / "rollouts" / f"step-{s + 1:06d}.parquet").stat().st_ino for s in (2, 3)} == stored
    from mlflow.tracking import MlflowClient

    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("hindsight").experiment_id],
                              "tags.`hindsight.resumed_from_step` = '2'")
    assert runs
    reused = {m.step for m in client.get_metric_history(runs[0].info.run_id, "runtime/rollout/reused")}
    assert reused == {3, 4}  # metric steps are 1-based: steps 2 and 3 came from the store
