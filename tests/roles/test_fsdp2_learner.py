"""The sharded learner (issue 25): an FSDP2 learner group of 2 (gloo) on a tiny Qwen2ForCausalLM
in Hugging Face format trains the weights one unsharded process trains, for GRPO and for PPO
with its critic, with and without mini- and micro-batches, and with CPU offload."""
import pytest

from hindsight.config import PipelineConfig
from hindsight.coordination.run import RLRun

STEPS = 3
ATOL = 1e-5  # the bar; measured below (printed) and in the closing note


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    import ray

    from hindsight.data.demo import build_demo_data
    from hindsight.models.tiny import build_tiny_qwen2

    work = tmp_path_factory.mktemp("fsdp2")
    build_demo_data(work / "data", seed=0)
    yield work, str(build_tiny_qwen2(work / "qwen2", hidden=32, layers=2, heads=4, kv_heads=2))
    ray.shutdown()


def config(work, run_dir, algorithm="grpo", workers=None, group=None, learner=None, **rl) -> PipelineConfig:
    """`group`: the learner group's keys (processes, strategy, offload); `learner`: the rest of rl.learner."""
    extra = {"ppo": {"critic_lr": 1e-3}} if algorithm == "ppo" else {}
    return PipelineConfig.model_validate({
        "name": "fsdp2", "seed": 2, "run_dir": str(run_dir),
        "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
        "rl": {"algorithm": algorithm, "steps": STEPS, "prompts_per_step": 3, "samples_per_prompt": 4,
               "learner": {"lr": 1e-3, **(group or {}), **(learner or {})}, "save_every": 1, "kl": {"coef": 0.05},
               "rollout": {"max_new_tokens": 6}, "scoring": {"isolation": "inline", "rewards": [{"fn": "helpers:varied"}]},
               "workers": workers or {}, **rl, **extra}})


def run_steps(cfg, init_path, until=STEPS) -> RLRun:
    run = RLRun(cfg, init_path, None)
    for step in range(run.start_step, until):  # as the flow does: a resumed run starts at its checkpoint
        run.rollout(step), run.score(step), run.update(step)
    return run


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def assert_same_training(one: RLRun, two: RLRun, init_path: str) -> None:
    from safetensors.torch import load_file

    start = load_file(f"{init_path}/model.safetensors")
    a, b = one.learner.full_state("policy"), two.learner.full_state("policy")
    moved = max((a[k] - start[k]).abs().max().item() for k in start)
    print(f"policy moved {moved:.2e}; unsharded vs fsdp2 max |diff| {max_diff(a, b):.2e}")
    assert moved > 1e-3  # the steps trained something, so equality says something
    assert max_diff(a, b) <= ATOL
    assert max_diff(one.policy.state_dict(), two.policy.state_dict()) <= ATOL  # the rollouts' copy too
    if one.learner.critic is not None:
        ca, cb = one.learner.full_state("critic"), two.learner.full_state("critic")
        print(f"critic: max |diff| {max_diff(ca, cb):.2e}")
        assert max_diff(ca, cb) <= ATOL
    for step in range(STEPS):  # the same tokens sampled, so the same batches were trained
        x, y = one.store.read("rollouts", step), two.store.read("rollouts", step)
        assert [r["completion_ids"] for r in x] == [r["completion_ids"] for r in y]


# 12 samples a step in mini-batches of 8 (two groups: one per rank) and 4 (one group: rank 1
# joins with a zero-weighted stand-in row), each in micro-batches of a few sequences, so the
# ranks run different numbers of micro-batches and the idle ones must still join every gather
BATCHING = {"mini_batch_size": 8, "micro_batch_tokens": 40}
RAY2, GROUP2 = {"placement": "ray"}, {"processes": 2, "strategy": "fsdp2"}


# packed micro-batches (rows end to end) on the group of two against one padded process: PPO,
# so the critic's packed forwards are in it too
PACKED = {**BATCHING, "packing": "on"}

# the sequence-level and the clipped-weight losses, mini- and micro-batched, ratios off 1 after step 0
GSPO = {**BATCHING, "loss": "gspo"}
CISPO = {**BATCHING, "loss": "cispo", "cispo": {"clip_max": 1.05}}


@pytest.mark.parametrize("algorithm,batching", [
    ("grpo", {}), ("grpo", BATCHING), ("ppo", {}), ("ppo", BATCHING), ("ppo", PACKED), ("grpo", GSPO),
    ("grpo", CISPO)],
    ids=["grpo-whole", "grpo-mini-micro", "ppo-whole", "ppo-mini-micro", "ppo-mini-micro-packed", "gspo-mini-micro",
         "cispo-mini-micro"])
def test_fsdp2_group_of_two_trains_what_one_process_trains(init, tmp_path, algorithm, batching):
    work, path = init
    padded = {k: v for k, v in batching.items() if k != "packing"}  # the one process always runs padded
    one = run_steps(config(work, tmp_path / "one", algorithm, learner=padded), path)
    two = run_steps(config(work, tmp_path / "two", algorithm, RAY2, group=GROUP2, learner=batching), path)
    try:
        assert_same_training(one, two, path)
        shard = next(two.learner.policy.parameters())
        assert type(shard).__name__ == "DTensor" and shard.to_local().shape[0] < shard.shape[0]  # really sharded
        assert (two.dir / "checkpoints" / "learner_state" / f"step-{STEPS:06d}" / ".metadata").is_file()
    finally:
        one.close(), two.close()


def test_fsdp2_with_cpu_offload_trains_the_same(init, tmp_path):
    work, path = init
    one = run_steps(config(work, tmp_path / "one", "ppo", learner=BATCHING), path)
    two = run_steps(config(work, tmp_path / "two", "ppo", RAY2, group={**GROUP2, "offload": True}, learner=BATCHING), path)
    try:
        assert_same_training(one, two, path)
        assert next(two.learner.policy.parameters()).to_local().device.type == "cpu"
    finally:
        one.close(), two.close()


def test_fsdp2_group_of_two_fits_an_auto_budget_and_trains_what_one_process_trains(init, tmp_path):
    """`micro_batch_tokens: auto` on a sharded group: the probes' forwards and backwards are
    collectives, so both ranks probe together at the start; the run trains what one process
    trains at the fitted budget."""
    work, path = init
    auto = {"micro_batch_tokens": "auto", "memory_cap_mb": 64000}
    two = run_steps(config(work, tmp_path / "two", "grpo", RAY2, group=GROUP2, learner=auto), path)
    fit = two.learner.budget_fit
    one = run_steps(config(work, tmp_path / "one", "grpo", learner={"micro_batch_tokens": fit["budget"]}), path)
    try:
        assert fit["cap_bytes"] == 64000 * 2**20 and fit["budget"] % fit["width"] == 0
        assert two.learner.settings.micro_batch_tokens == fit["budget"] == two.rl.learner.micro_batch_tokens
        assert_same_training(one, two, path)
    finally:
        one.close(), two.close()
