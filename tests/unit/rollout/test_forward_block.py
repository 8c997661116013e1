"""`rl.forward`: the rollout worker's and the scorer's forward budgets are a block of their own,
so `rl.learner` is the learner's. By default (`learner`) they take the learner's setting, fitted
budget included; set, the worker's behaviour and the scorer's reference forwards run with it
whatever the learner's."""
import pytest

from helpers import rl_cfg, tiny_init


def test_by_default_the_forwards_take_the_learners_setting(tmp_path):
    cfg = rl_cfg(tmp_path, learner={"micro_batch_tokens": 64, "packing": "auto"})
    assert cfg.rl.forward.micro_batch_tokens == "learner" and cfg.rl.forward_budget() == (64, "auto")
    cfg = rl_cfg(tmp_path, learner={"micro_batch_tokens": 64}, forward={"micro_batch_tokens": None, "packing": "on"})
    assert cfg.rl.forward_budget() == (None, "on")
    with pytest.raises(ValueError, match="forward.packing"):
        rl_cfg(tmp_path, forward={"packing": "sometimes"})


def test_the_worker_and_the_scorer_forward_with_rl_forward_not_the_learners(tmp_path, monkeypatch):
    import hindsight.rollout.hf as sampler
    import hindsight.rollout.worker as worker
    import hindsight.scoring.scorer as scorer
    from hindsight.coordination.run import RLRun

    seen = []
    for module in (sampler, worker, scorer):
        real = module.budgeted_logprobs

        def recorded(model, exp, temperature, budget, packing="off", _name=module.__name__, _real=real):
            seen.append((_name, budget, packing))
            return _real(model, exp, temperature, budget, packing)
        monkeypatch.setattr(module, "budgeted_logprobs", recorded)
    init = tiny_init(tmp_path)
    cfg = rl_cfg(tmp_path, steps=1, kl={"coef": 0.05}, learner={"micro_batch_tokens": 4096},
                 forward={"micro_batch_tokens": 64, "packing": "on"})
    run = RLRun(cfg, init, None)
    try:
        run.rollout(0), run.score(0)
    finally:
        run.close()
    # the hf engine's behaviour forward (the worker recomputes them only for an engine that asks, vLLM),
    # which takes the budget and not packing; the scorer's reference forward takes both
    assert set(seen) == {("hindsight.rollout.hf", 64, "off"), ("hindsight.scoring.scorer", 64, "on")}
