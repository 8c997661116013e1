"""An FSDP2 learner group of 2 resumes from its torch.distributed.checkpoint shards: the RL
command is SIGKILLed mid-training, a flipped bit in a rank's newest shard is caught by its
sha256, and the rerun of the same command falls back to the newest intact version and ends
allclose to an uninterrupted run. Through the CLI, on a tiny Qwen2 in Hugging Face format."""
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import run_rl_killable

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
CONFIG = """
name: fsdp2-faults
seed: 0
model: {{base: tiny://qwen2}}
sft: {{enabled: false}}
reward_model: {{enabled: false}}
rl:
  init: {init}
  steps: {steps}
  prompts_per_step: 4
  samples_per_prompt: 4
  learner: {learner}
  kl: {{coef: 0.02}}
  scoring:  # a reward that differs within groups: real gradients, not float noise
    rewards: [{{fn: "helpers:varied"}}]
  rollout: {{max_new_tokens: 4}}
  eval_every: 100
  save_every: 2
  workers: {workers}
eval: {{limit: 4, max_new_tokens: 4}}
retries: {{count: 0}}
"""
FSDP2 = "{placement: ray, rollout: 1, scorer: 1}"
FSDP2_LEARNER = "{lr: 1.0e-3, processes: 2, strategy: fsdp2}"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    from hindsight.models.tiny import build_tiny_qwen2

    work = tmp_path_factory.mktemp("fsdp2-faults")
    init = build_tiny_qwen2(work / "init", hidden=32, layers=2)
    (work / "one.yaml").write_text(CONFIG.format(init=init, steps=STEPS, workers="{}", learner="{lr: 1.0e-3}"))
    (work / "fsdp2.yaml").write_text(CONFIG.format(init=init, steps=STEPS, workers=FSDP2, learner=FSDP2_LEARNER))
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("HINDSIGHT_FAULT", None)
    reference = run_rl_killable(work, env, "one.yaml", "reference")  # one unsharded process, never interrupted
    assert reference.returncode == 0, reference.stdout[-3000:]
    return work, env


def _final(work, run_dir) -> dict:
    return load_file(work / "runs" / run_dir / "rl" / "checkpoints" / "policy" / f"step-{STEPS:06d}" /
                     "model.safetensors")


def _assert_matches_reference(work, run_dir) -> None:
    ref, got = _final(work, "reference"), _final(work, run_dir)
    assert ref.keys() == got.keys()
    diff = max((got[k] - ref[k]).abs().max().item() for k in ref)
    print(f"{run_dir}: resumed fsdp2 vs uninterrupted max |diff| {diff:.2e}")
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=1e-5, rtol=0)


def test_sigkill_then_a_flipped_bit_resumes_from_the_newest_intact_sharded_checkpoint(workspace):
    """One killed run for both checks (each FSDP2 run on Ray costs most of a minute): SIGKILLed
    after checkpoints 2 and 4, a bit of step 4's rank-1 shard flipped, the rerun falls back to
    step 2's shards and ends where the uninterrupted run does."""
    work, env = workspace
    crashed = run_rl_killable(work, env, "fsdp2.yaml", "flipped", "update:5")  # checkpoints 2 and 4 kept
    assert crashed.returncode == -9, crashed.stdout[-3000:]  # really killed, not a clean exit
    for step in (2, 4):
        state = work / f"runs/flipped/rl/checkpoints/learner_state/step-{step:06d}"
        assert sorted(p.name for p in state.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # per rank
    shard = work / "runs/flipped/rl/checkpoints/learner_state/step-000004/__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit of rank 1's shard
    shard.write_bytes(bytes(data))
    resumed = run_rl_killable(work, env, "fsdp2.yaml", "flipped")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "checkpoint step 4 is corrupt (learner_state/step-000004/__1_0.distcp" in resumed.stdout
    assert "resuming from step 2, the newest intact version" in resumed.stdout
    assert list((work / "runs/flipped/rl/checkpoints/corrupt").rglob("__1_0.distcp"))  # kept aside, not deleted
    _assert_matches_reference(work, "flipped")
