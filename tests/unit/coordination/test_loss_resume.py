"""A run with a sequence-level loss (GSPO), stopped after its checkpoint and resumed, ends with the
weights of the run that went straight through: the loss and its block are in the resume state,
and its steps had signal (varied rewards) and clipping (two optimizer steps a step)."""
import pytest
import torch

from helpers import rl_cfg, tiny_init

STEPS = 4
LEARNER = {"loss": "gspo", "gspo": {"clip_eps_low": 0.02, "clip_eps_high": 0.02}, "mini_batch_size": 8,
           "lr": 1e-2}


# the adaptive entropy coefficient is state: it rises each optimizer step while the entropy is under
# the target (always, at 100 nats), and a resume must apply the value the straight run reached
ADAPTIVE = {**LEARNER, "entropy_coef": 0.01, "adaptive_entropy": {"enabled": True, "target": 100.0, "delta": 0.05}}


def _cfg(tmp_path, run_dir, learner):
    cfg = rl_cfg(tmp_path, steps=STEPS, save_every=2, learner=learner)
    return type(cfg).model_validate({**cfg.model_dump(mode="json", by_alias=True), "run_dir": str(tmp_path / run_dir)})


def _steps(run, upto):
    metrics = []
    for step in range(run.start_step, upto):
        run.rollout(step), run.score(step)
        metrics.append(run.update(step))
    return metrics


@pytest.mark.parametrize("learner", [LEARNER, ADAPTIVE], ids=["gspo", "gspo-adaptive-entropy"])
def test_a_resumed_gspo_run_ends_where_an_uninterrupted_one_does(tmp_path, learner):
    from hindsight.coordination.run import RLRun

    init = tiny_init(tmp_path)
    straight = RLRun(_cfg(tmp_path, "a", learner), init, None)
    metrics = _steps(straight, STEPS)
    assert any(m["clip_fraction"] > 0 for m in metrics) and all(m["grad_norm"] > 0 for m in metrics)
    first = RLRun(_cfg(tmp_path, "b", learner), init, None)
    _steps(first, 3)  # past the step-2 checkpoint: step 2 is redone
    first.close()
    resumed = RLRun(_cfg(tmp_path, "b", learner), init, None)
    assert resumed.start_step == 2 and resumed.learner.settings.loss.loss == "gspo"
    _steps(resumed, STEPS)
    if learner is ADAPTIVE:
        assert resumed.learner.settings.entropy.coef == pytest.approx(straight.learner.settings.entropy.coef)
        assert straight.learner.settings.entropy.coef > 0.01 + 0.05  # it moved
    for (name, a), b in zip(straight.policy.state_dict().items(), resumed.policy.state_dict().values()):
        assert torch.equal(a, b), name
    straight.close(), resumed.close()
