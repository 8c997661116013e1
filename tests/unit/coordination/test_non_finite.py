"""Never a non-finite model: a step whose loss or gradient is not finite skips its optimizer step
and stops with one error naming the newest (finite) checkpoint; no checkpoint of NaN weights is
written; a stage whose trained weights hold NaN registers nothing."""
import pytest
import torch
from safetensors.torch import load_file, save_file

from hindsight.coordination.run import RLRun
from hindsight.errors import NonFiniteError
from hindsight.state.checkpoint import require_finite
from tests.helpers import rl_cfg, tiny_init


def test_a_diverging_step_is_skipped_and_stops_the_run_naming_the_newest_checkpoint(tmp_path):
    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path, lr=1e30, steps=4), init, None)  # finite, and certain to diverge
    try:
        stopped = None
        for step in range(4):
            run.rollout(step), run.score(step)
            before = [p.detach().clone() for p in run.policy.parameters()]
            try:
                run.update(step)
            except NonFiniteError as exc:
                stopped = (step, str(exc), before)
                break
            run.checkpoint(step + 1)
        assert stopped is not None, "lr 1e30 never produced a non-finite loss"
        step, message, before = stopped
        assert message.startswith(f"step {step}: the policy's loss is")
        assert "the optimizer step was skipped, and the run stopped: nothing of this step is saved" in message
        assert f"The newest checkpoint, all finite, is step {step}" in message
        # the skipped step left the weights as they were (no NaN written into them)
        assert all(torch.equal(a, b) for a, b in zip(before, run.policy.parameters()))
        assert run.ckpt.latest_step() == step
    finally:
        run.close()


def test_no_checkpoint_is_written_from_non_finite_weights(tmp_path):
    init = tiny_init(tmp_path)
    run = RLRun(rl_cfg(tmp_path), init, None)
    try:
        with torch.no_grad():
            next(run.policy.parameters()).fill_(float("nan"))
        with pytest.raises(NonFiniteError, match="step 1: the policy's weights are not finite, so no checkpoint is "
                                                 "written. There is no checkpoint yet"):
            run.checkpoint(1)
        assert run.ckpt.latest_step() is None
    finally:
        run.close()


def test_a_stage_with_nan_weights_registers_nothing(tmp_path):
    init = tiny_init(tmp_path)
    require_finite(init, "sft")  # a finite model passes
    weights = load_file(f"{init}/model.safetensors")
    name = sorted(weights)[0]
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, f"{init}/model.safetensors")
    with pytest.raises(NonFiniteError, match=f"stage sft: model.safetensors holds non-finite weights \\({name}\\)"):
        require_finite(init, "sft")
