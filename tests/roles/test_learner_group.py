"""The learner group (issue 16): P = 2 learner processes in one gloo group for the whole stage
train the weights a single process trains at the same global batch, for GRPO and for PPO
with its critic, and no process is started per step. A rank lost mid-stage (killed, or stopped
answering) is rebuilt in place (issue 47)."""
import json

import pytest
import torch

from helpers import stop_when_paused
from hindsight.config import PipelineConfig
from hindsight.coordination.run import RLRun

STEPS = 3
# 1 and 2 learners sum the gradient in a different order: the first step's gradients agree to
# 8e-8 of their largest (GRAD_RTOL checks it). Adam's first step then divides each gradient by its
# own size plus eps (1e-8), so an element whose gradient is itself at eps's scale, where
# the float noise of a near-cancelled sum is a large share of it, moves by a visibly different
# fraction of lr: measured 2.65e-4 on one tied-embedding element (gradients 3.6e-9 and 3.1e-9;
# 2.65e-5 at lr 1e-3, proportional to lr), the same before the strategy refactor. (1.9e-5 was
# measured with an earlier transformers, whose sums cancelled differently.)
ATOL = 5e-4
LOGPROB_ATOL = 1e-3
GRAD_RTOL = 1e-6



@pytest.fixture(scope="module")
def init(tiny_init):
    import ray

    yield tiny_init
    ray.shutdown()


def _run(work, init, run_dir, algorithm, workers, processes=1, **learner):
    """`learner`: rl.learner's keys besides lr and processes (batching, packing, the loss)."""
    extra = {"ppo": {"critic_lr": 1e-3}} if algorithm == "ppo" else {}
    cfg = PipelineConfig.model_validate({
        "name": "learners", "seed": 2, "run_dir": str(run_dir),
        "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
        "rl": {"algorithm": algorithm, "steps": STEPS, "prompts_per_step": 3, "samples_per_prompt": 4,
               "learner": {"lr": 1e-2, "processes": processes, **learner}, "save_every": 1, "kl": {"coef": 0.05},
               "rollout": {"max_new_tokens": 5}, "scoring": {"isolation": "inline", "rewards": [{"fn": "helpers:varied"}]},
               "workers": workers, **extra}})
    run = RLRun(cfg, init, None)
    pids, spawned = [], []
    for step in range(run.start_step, STEPS):  # as the flow does: a resumed run starts at its checkpoint
        run.rollout(step), run.score(step), run.update(step)
        if step == 0:  # Adam's first moment after one step is (1 - beta1) x the summed gradient
            opt = run.learner.optimizer
            run.first_grads = [opt.state[p]["exp_avg"].clone() / 0.1 for g in opt.param_groups for p in g["params"]]
        if run.learner.group is not None:
            pids.append(run.learner.group.ray.get([p.pid.remote() for p in run.learner.group.peers]))
            spawned.append((run.pool.rollout.spawned, run.pool.scorer.spawned))
    return run, pids, spawned


# 12 samples a step in mini-batches of 8 (two groups: one per rank) and 4 (one group: rank 1
# joins with a zero-weighted stand-in row), each in micro-batches of a few sequences
BATCHING = {"mini_batch_size": 8, "micro_batch_tokens": 24}


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
def test_two_learners_train_what_one_trains(init, tmp_path, algorithm, batching):
    padded = {k: v for k, v in batching.items() if k != "packing"}  # the one process always runs padded
    one, _, _ = _run(*init, tmp_path / "one", algorithm, {}, **padded)
    two, pids, spawned = _run(*init, tmp_path / "two", algorithm, {"placement": "ray"}, processes=2, **batching)
    moved = max((a - b).abs().max().item() for a, b in zip(one.policy.parameters(), two.policy.parameters()))
    print(f"{algorithm}: 1 vs 2 learners max |diff| {moved:.2e}")
    if not batching:  # one optimizer step in step 0: its first moment is that step's summed gradient
        for a, b in zip(one.first_grads, two.first_grads):  # the group's gradient is the one-process gradient
            assert (a - b).abs().max() <= GRAD_RTOL * a.abs().max()
    for (k, a), (_, b) in zip(one.policy.state_dict().items(), two.policy.state_dict().items()):
        assert torch.allclose(a, b, atol=ATOL), k
    if algorithm == "ppo":
        for (k, a), (_, b) in zip(one.learner.critic.state_dict().items(), two.learner.critic.state_dict().items()):
            assert torch.allclose(a, b, atol=ATOL), k
    for step in range(STEPS):  # the same tokens sampled, so the same batches were trained
        a, b = one.store.read("rollouts", step), two.store.read("rollouts", step)
        assert [r["completion_ids"] for r in a] == [r["completion_ids"] for r in b]
        for x, y in zip(a, b):
            assert torch.allclose(torch.tensor(x["logprobs"]), torch.tensor(y["logprobs"]), atol=LOGPROB_ATOL)
    # one group for the whole stage: the same peer process every step, no actor started, no relaunch
    assert len({tuple(p) for p in pids}) == 1 and len(set(spawned)) == 1
    assert not (two.dir / "launch").exists()
    one.close(), two.close()


@pytest.mark.parametrize("fault", ["kill_once", "pause"], ids=["sigkill", "sigstop"])
def test_a_lost_learner_rank_is_rebuilt_in_place_and_the_run_ends_as_an_uninterrupted_one(init, tmp_path, monkeypatch,
                                                                                        fault):
    """Learner rank 1 is SIGKILLed, or SIGSTOPped (alive, silent), in its second update.
    Rank 0's collective fails on the closed connection or after the group's timeout
    (collective_min_s 15 s here, the measured update being far less); the group is rebuilt in
    the same attempt from the newest checkpoint (none yet: save_every 2, so from the start), the
    stored step 0 is trained again, then step 1, and the run ends where an uninterrupted run ends,
    each group trained once."""
    work, path = init
    reference, _, _ = _run(work, path, tmp_path / "reference", "grpo", {})
    marker = tmp_path / "hit"
    monkeypatch.setenv("HINDSIGHT_FAULT", f"{fault}:learner1:1:{marker}")
    if fault == "pause":
        stop_when_paused(marker)
    raw = reference.cfg.model_dump(mode="json", by_alias=True)
    raw["run_dir"], raw["rl"]["workers"] = str(tmp_path / "run"), {"placement": "ray", "collective_min_s": 15}
    raw["rl"]["learner"]["processes"], raw["rl"]["save_every"] = 2, 2
    run = RLRun(PipelineConfig.model_validate(raw), path, None)
    try:
        metrics = [(run.rollout(step), run.score(step), run.update(step))[2] for step in range(STEPS)]
    finally:
        run.close()
    assert marker.exists(), "the fault never fired: the test would prove nothing"
    events = [json.loads(x) for x in (run.dir / "workers.jsonl").read_text().splitlines()]
    assert [(e["step"], e["role"], e["checkpoint"], e["replayed"]) for e in events] == [(1, "learner", 0, [0])]
    print(f"{fault}: the group rebuilt and step 0 trained again in {events[0]['seconds']:.1f} s")  # for the notes
    assert metrics[1]["workers/learner_replayed_steps"] == 1.0
    for step in range(STEPS):
        assert [e.trained for e in run.ledger.read(step).values()] == [1, 1, 1]
    for (k, a), (_, b) in zip(reference.policy.state_dict().items(), run.policy.state_dict().items()):
        assert torch.allclose(a, b, atol=ATOL), k
    reference.close()
