"""The run fingerprint on resume: sampling and algorithm changes are refused (with or without a
checkpoint), a scoring change re-scores the stored rollouts, a training change applies and is
recorded, and a finished run is never resumed under other settings."""
import json

import pytest

from hindsight.errors import CheckpointError
from hindsight.state.fingerprint import check_not_finished
from hindsight.coordination.run import RLRun
from helpers import rl_cfg, tiny_init


def constant_reward(completions, value=7.0, **_):
    return [float(value)] * len(completions)


def test_the_fingerprint_is_on_disk_before_the_first_shard(tmp_path):
    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path), init, None)
    stored = json.loads((run.dir / "fingerprint.json").read_text())
    assert not run.store.steps("rollouts")
    assert stored["sampling"]["samples_per_prompt"] == 4 and stored["algorithm"] == {"algorithm": "grpo"}
    assert stored["scoring"]["rewards"][0]["fn"] == "helpers:varied"
    assert len(stored["scoring"]["rewards"][0]["source"]) == 16 and stored["training"]["lr"] == run.rl.learner.lr
    run.close()


def test_a_changed_group_size_is_refused_with_no_checkpoint_yet(tmp_path):
    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path), init, None)
    run.rollout(0)  # a stored shard of groups of 4, and no checkpoint
    run.close()
    assert run.ckpt.latest_step() is None
    with pytest.raises(CheckpointError, match=r"samples_per_prompt: stored 4, config 2\); rerun with --force"):
        RLRun(rl_cfg(tmp_path, samples_per_prompt=2), init, None)
    with pytest.raises(CheckpointError, match=r"rollout.temperature: stored 1.0, config 0.7"):
        RLRun(rl_cfg(tmp_path, rollout={"max_new_tokens": 4, "temperature": 0.7}), init, None)
    with pytest.raises(CheckpointError, match=r"algorithm: stored 'grpo', config 'rloo'"):
        RLRun(rl_cfg(tmp_path, algorithm="rloo"), init, None)


def test_a_changed_reward_rescores_the_stored_rollouts(tmp_path):
    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path, save_every=1), init, None)
    for step in (0, 1):
        run.rollout(step), run.score(step)
    run.update(0)  # checkpoint at 1: step 0 is trained, step 1 stored and scored, not trained
    rollouts = run.store.path("rollouts", 1).read_bytes()
    old = [s["reward"] for s in run.store.read("scores", 1)]
    run.close()
    assert set(old) != {7.0}

    changed = rl_cfg(tmp_path, save_every=1, rewards=[{"fn": "test_fingerprint:constant_reward", "args": {"value": 7}}])
    resumed = RLRun(changed, init, None)
    assert resumed.start_step == 1 and resumed.resume_changes.keys("scoring")
    assert resumed.store.has("scores", 0) and not resumed.store.has("scores", 1)  # trained steps keep their scores
    assert len(list((resumed.dir / "rescored").glob("*/scores/step-000002.parquet"))) == 1  # moved aside, not lost
    assert resumed.rollout(1)[1] == {"rollout/reused": 1.0}
    resumed.score(1)
    assert [s["reward"] for s in resumed.store.read("scores", 1)] == [7.0] * len(old)
    assert resumed.store.path("rollouts", 1).read_bytes() == rollouts  # the rollouts themselves are untouched
    resumed.update(1)
    resumed.close()

    again = RLRun(rl_cfg(tmp_path, steps=3, save_every=1, rewards=[
        {"fn": "test_fingerprint:constant_reward", "args": {"value": 3}}]), init, None)
    assert again.resume_changes.describe("scoring") == "rewards.0.args.value: stored 7, config 3"
    again.close()


def test_a_training_change_takes_effect_and_is_recorded(tmp_path):
    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path, steps=3, save_every=1, lr=1e-3), init, None)
    run.rollout(0), run.score(0), run.update(0)
    run.close()
    resumed = RLRun(rl_cfg(tmp_path, steps=3, save_every=1, learner={"lr": 5e-4, "grpo": {"clip_eps_high": 0.28}}),
                    init, None)
    assert resumed.learner.optimizer.param_groups[0]["lr"] == 5e-4
    assert resumed.learner.settings.loss.settings.clip_eps_high == 0.28
    record = json.loads((resumed.dir / "resume-changes.jsonl").read_text().splitlines()[-1])
    assert record["step"] == 1 and record["changes"]["training"] == {"grpo.clip_eps_high": [0.2, 0.28],
                                                                     "lr": [1e-3, 5e-4]}
    resumed.close()


def test_a_finished_run_is_not_resumed_under_other_settings(tmp_path):
    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path, steps=1, lr=1e-3), init, None)
    run.rollout(0), run.score(0), run.update(0)
    run.close()
    assert run.ckpt.latest_step() == 1
    for changed in ({"lr": 2e-3}, {"kl": {"coef": 0.1}}):
        with pytest.raises(CheckpointError, match="finished at step 1 under other settings.*nothing was trained or registered"):
            RLRun(rl_cfg(tmp_path, steps=1, **{"lr": 1e-3, **changed}), init, None)
    same = RLRun(rl_cfg(tmp_path, steps=1, lr=1e-3), init, None)  # the same settings: opens (for a report)...
    with pytest.raises(CheckpointError, match="already finished at step 1; nothing to train, so nothing is registered"):
        check_not_finished(same.dir, same.start_step, 1)  # ...but the stage refuses to register it again
    same.close()
    RLRun(rl_cfg(tmp_path, steps=2, lr=1e-3), init, None).close()  # more steps: it trains on
