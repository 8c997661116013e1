"""A multi-turn RL run (a gym-style environment answering every model turn) SIGKILLed in the
middle of a step's trajectories, then rerun: it ends where an uninterrupted run ends, and every
stored trajectory keeps its turns."""
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from helpers import run_rl_killable, short_turn_model

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4
CONFIG = """
name: turns
seed: 0
data: {{prompt_format: chat}}
sft: {{enabled: false}}
reward_model: {{enabled: false}}
rl:
  init: {init}
  steps: {steps}
  prompts_per_step: 3
  samples_per_prompt: 2
  learner: {{lr: 1.0e-3}}
  kl: {{coef: 0.02}}
  rollout:
    max_new_tokens: 6
    groups_per_batch: 1
    multi_turn: {{gym: "helpers:Guess", max_turns: 3, max_tokens: 40}}
  scoring:
    rewards: [{{fn: "rewards.environment:environment_reward"}}]
  eval_every: 100
  save_every: 2
eval: {{limit: 4, max_new_tokens: 6, reward: "rewards.exact:exact_answer"}}
retries: {{count: 0}}
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    work = tmp_path_factory.mktemp("turns")
    short_turn_model(work / "init")  # turns that end, so the game goes on
    (work / "rl.yaml").write_text(CONFIG.format(init=work / "init", steps=STEPS))
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}",
           "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("HINDSIGHT_FAULT", None)
    reference = run_rl_killable(work, env, "rl.yaml", "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]
    return work, env


def _rows(work, run_dir):
    rl = work / "runs" / run_dir / "rl"
    return [r for s in range(STEPS) for r in pq.read_table(rl / "rollouts" / f"step-{s + 1:06d}.parquet").to_pylist()]


def test_sigkill_mid_trajectories_then_rerun_ends_where_an_uninterrupted_run_ends(workspace):
    work, env = workspace
    crashed = run_rl_killable(work, env, "rl.yaml", "killed", "rollout-group1:2")
    assert crashed.returncode == -9, crashed.stdout[-2000:]
    parts = list((work / "runs/killed/rl/parts/rollouts/step-000003").glob("*.parquet"))
    assert parts, "the kill came after some of step 2's trajectories were stored"
    resumed = run_rl_killable(work, env, "rl.yaml", "killed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    ref, got = _rows(work, "reference"), _rows(work, "killed")
    assert [(r["completion_ids"], r["action_mask"], r["turns"]) for r in got] == \
           [(r["completion_ids"], r["action_mask"], r["turns"]) for r in ref]
    turns = [json.loads(r["turns"]) for r in ref]
    assert sum(len(t) > 1 for t in turns) >= len(turns) // 2, "most trajectories have several turns"
    assert any(0 in r["action_mask"] for r in ref)
    final = f"policy/step-{STEPS:06d}/model.safetensors"
    a = load_file(work / "runs/reference/rl/checkpoints" / final)
    b = load_file(work / "runs/killed/rl/checkpoints" / final)
    assert a.keys() == b.keys()
    assert any(not torch.equal(a[k], load_file(work / "init/model.safetensors")[k]) for k in a if k in
               load_file(work / "init/model.safetensors")), "training moved the weights"
    for k in a:
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=0)
