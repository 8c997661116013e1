"""Never a diverged model: a step whose loss or gradient is not finite skips its optimizer step,
and a finite step that diverges (the loss, the gradient norm or the weights' norm out of its band)
stops the run before its checkpoint, with one error naming the newest healthy checkpoint; no
checkpoint of NaN or 1e30 weights is written; a stage whose trained weights hold NaN or a weight
beyond model.max_weight_abs registers nothing."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from hindsight.coordination.run import RLRun
from hindsight.errors import NonFiniteError
from hindsight.learning.health import DivergedError, Health
from hindsight.state.checkpoint import require_healthy
from tests.helpers import rl_cfg, tiny_init


def test_a_finite_but_diverging_step_stops_before_its_checkpoint(tmp_path):
    """lr 1e30 keeps the loss finite in the first step and sends every weight to ~1e30: it used to
    be checkpointed as "all finite" and resumed from."""
    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path, lr=1e30, steps=4, save_every=1), init, None)
    try:
        run.rollout(0), run.score(0)
        with pytest.raises(DivergedError) as err:
            run.update(0)
        message = str(err.value)
        assert message.startswith("step 0: the weights' norm went from") and "in one optimizer step" in message
        assert "the run stopped: nothing of this step is saved or registered" in message
        assert "There is no checkpoint yet" in message
        assert run.ckpt.latest_step() is None  # its checkpoint (save_every 1) was never written
        assert not run.weights_healthy()
        with pytest.raises(NonFiniteError, match="beyond model.max_weight_abs 10000, so no checkpoint is written"):
            run.checkpoint(1)
    finally:
        run.close()


def test_the_bands_follow_running_medians(tmp_path):
    from hindsight.config import LearnerConfig

    health = Health(LearnerConfig().health)  # 3 steps of warm-up, factors of 100
    for loss, grad in ((0.01, 1.0), (-0.02, 2.0), (0.0, 0.5)):
        health.before_step(loss, grad)
    health.before_step(0.5, 90.0)  # within 100 x the median
    with pytest.raises(DivergedError, match="the gradient norm 500 is above 100 times its running median 1.5"):
        health.before_step(0.0, 500.0)
    with pytest.raises(DivergedError, match="the loss 1e\\+04 is above 100 times"):
        health.before_step(1e4, 1.0)
    quiet = Health(LearnerConfig().health)  # steps whose groups all tie: no gradient, no scale
    for _ in range(5):
        quiet.before_step(0.0, 0.0)
    quiet.before_step(0.0, 1.4e-6)  # the first step with a gradient is not measured against zeros
    for grad in (5.9e-7, 6.1e-7):  # nearly tied groups: norms at round-off, then the first with signal
        quiet.before_step(0.0, grad)
    quiet.before_step(0.0, 1.4e-4)  # 230 x the median (CI's preemption run once stopped here), within 0.01
    with pytest.raises(DivergedError, match="running median .* \\+ 0.01"):
        quiet.before_step(0.0, 0.2)
    layer = torch.nn.Linear(4, 4)
    health.after_step(layer.parameters())
    with torch.no_grad():
        layer.weight.mul_(1.2)
    health.after_step(layer.parameters())  # a change within half its norm
    with torch.no_grad():
        layer.weight.mul_(1e6)
    with pytest.raises(DivergedError, match="the weights' norm went from"):
        health.after_step(layer.parameters())


def test_no_checkpoint_is_written_from_non_finite_weights(tmp_path):
    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path), init, None)
    try:
        with torch.no_grad():
            next(run.policy.parameters()).fill_(float("nan"))
        with pytest.raises(NonFiniteError, match="step 1: the policy's weights are not finite or beyond "
                                                 "model.max_weight_abs 10000, so no checkpoint is written. There is no "
                                                 "checkpoint yet"):
            run.checkpoint(1)
        assert run.ckpt.latest_step() is None
    finally:
        run.close()


def test_a_stage_with_nan_or_huge_weights_registers_nothing(tmp_path):
    init = tiny_init(tmp_path)
    require_healthy(init, "sft", 1e4)  # a trained model passes
    weights = load_file(f"{init}/model.safetensors")
    name = sorted(weights)[0]
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, f"{init}/model.safetensors")
    with pytest.raises(NonFiniteError, match=f"stage sft: model.safetensors holds non-finite weights \\({name}\\)"):
        require_healthy(init, "sft", 1e4)
    weights[name] = torch.full_like(weights[name], 1e30)
    save_file(weights, f"{init}/model.safetensors")
    with pytest.raises(NonFiniteError, match=f"holds a weight of 1e\\+30 \\({name}\\), beyond model.max_weight_abs 10000"):
        require_healthy(init, "sft", 1e4)
