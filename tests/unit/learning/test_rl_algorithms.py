"""Each algorithm through the RL stage's own step logic (no Prefect): it trains, checkpoints
and resumes; PPO's critic is a versioned component; dynamic sampling and replay pick groups."""
import pytest
import torch
from safetensors.torch import load_file

from hindsight.config import PipelineConfig
from hindsight.data.demo import build_demo_data
from hindsight.models.tiny import build_tiny_model
from hindsight.coordination.run import RLRun


def varied_reward(completions, **_):
    """Not constant within a group, so every estimator sees a signal."""
    return [float(len(c) % 3) for c in completions]


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    work = tmp_path_factory.mktemp("algos")
    build_demo_data(work / "data", seed=0)
    return work, str(build_tiny_model(work / "init", hidden=32, layers=1, heads=2))


def _cfg(work, run_dir, **rl):
    return PipelineConfig.model_validate({
        "name": "algos", "seed": 0, "run_dir": str(run_dir),
        "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
        "rl": {"steps": 3, "prompts_per_step": 4, "samples_per_prompt": 4, "save_every": 1, "rollout": {"max_new_tokens": 4},
               "scoring": {"isolation": "inline", "rewards": [{"fn": "test_rl_algorithms:varied_reward"}]}, **rl}})


def _train(run, steps):
    out = []
    for step in steps:
        out.append((run.rollout(step)[1], run.score(step)[1], run.update(step)))
    return out


@pytest.mark.parametrize("algorithm,extra", [
    ("grpo", {"grpo": {"scale_rewards": "batch"}}),
    ("rloo", {"kl": {"in": "reward", "coef": 0.1, "estimator": "k1"}}),
    ("reinforce_pp", {"kl": {"in": "reward", "coef": 0.1}, "samples_per_prompt": 1}),
    ("ppo", {"learner": {"entropy_coef": 0.01}, "ppo": {"critic_lr": 1e-3}}),
])
def test_each_algorithm_trains_and_changes_the_policy(init, tmp_path, algorithm, extra):
    work, path = init
    run = RLRun(_cfg(work, tmp_path, algorithm=algorithm, **extra), path, None)
    before = [p.detach().clone() for p in run.policy.parameters()]
    (_, _, metrics), = _train(run, [0])
    assert any(not torch.equal(a, b) for a, b in zip(before, run.policy.parameters()))
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    if algorithm == "ppo":
        assert metrics["critic/loss"] > 0
    run.close()


def test_ppo_critic_is_a_versioned_component_and_resumes(init, tmp_path):
    work, path = init
    cfg = _cfg(work, tmp_path, algorithm="ppo", ppo={"critic_lr": 1e-3})
    run = RLRun(cfg, path, None)
    _train(run, [0, 1])
    manifest = run.ckpt.manifest()
    assert manifest["critic"] == manifest["critic_optimizer"] == 2
    saved = load_file(str(run.ckpt.critic_dir(2) / "model.safetensors"))
    run.close()
    resumed = RLRun(cfg, path, None)
    assert resumed.start_step == 2
    state = resumed.learner.critic.state_dict()
    assert all(torch.equal(state[k], v) for k, v in saved.items() if k in state)
    assert resumed.learner.critic_optimizer.state_dict()["state"], "critic optimizer state was not restored"
    resumed.close()


def test_dynamic_sampling_and_replay(init, tmp_path):
    work, path = init
    cfg = _cfg(work, tmp_path, dynamic_sampling={"enabled": True, "oversample": 2.0}, replay={"ratio": 0.5, "window": 4})
    run = RLRun(cfg, path, None)
    (r0, _, m0), (r1, _, m1) = _train(run, [0, 1])
    assert len(run.store.read("rollouts", 0)) == 8 * 4  # 2x oversampled groups were sampled and stored
    assert m0["dynamic_sampling/kept_groups"] <= 4
    assert m0["dynamic_sampling/kept_groups"] + m0["dynamic_sampling/dropped_groups"] <= 8
    assert r0["replay/count"] == 0 and r1["replay/count"] == 2  # nothing was stored before step 0
    replayed = [r for r in run.store.read("rollouts", 1) if r["replayed"]]
    assert {r["prompt_id"] for r in replayed} == set(r1["replay/ids"])
    run.close()
