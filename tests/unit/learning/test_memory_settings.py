"""Memory settings that real runs need: activation checkpointing gives the gradients the plain
forward gives (also through the GRPO path, which falls back from the shared-prompt cache), and
bf16 compute keeps float32 master weights, so a small step still moves them."""
import copy

import pytest
import torch

from hindsight.config import ModelConfig, PipelineConfig
from hindsight.errors import ConfigError
from hindsight.learning.losses.objective import Objective
from hindsight.learning.build import build_optimizer, build_policy
from hindsight.learning.update import LearnerSettings, update
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.tiny import build_tiny_model
from hindsight.rollout.hf import sample_groups

from helpers import grads_at_step


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("m") / "m", hidden=32, layers=2, heads=2)
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    exp = sample_groups(model, tok, ["Ann has 40 pens", "Bob has 10 cats"], [1, 2], 4, 6)
    exp.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.5])
    return str(path), exp


def _rl(**kw):
    return PipelineConfig.model_validate({"rl": {"scoring": {"rewards": [{"fn": "rewards.exact:exact_answer"}]}, **kw}}).rl


def _grads(path, exp, checkpointing):
    model = build_policy(path, ModelConfig(gradient_checkpointing=checkpointing), _rl())
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # a step of 0: the gradients are what is compared
    grads = grads_at_step(opt)
    update(model, opt, copy.deepcopy(exp), LearnerSettings(loss=Objective(kl_coef=0.0, max_len=6)))
    return model, {n: grads[id(p)] for n, p in model.named_parameters() if id(p) in grads}


def test_activation_checkpointing_gives_the_same_gradients(tiny):
    path, exp = tiny
    plain, g_plain = _grads(path, exp, False)
    ckpt, g_ckpt = _grads(path, exp, True)
    on = [getattr(m, "is_activation_checkpointing", None) for m in (ckpt, plain)]  # transformers < 5.20: the old name
    on = on if None not in on else [m.is_gradient_checkpointing for m in (ckpt, plain)]
    assert on == [True, False]
    assert g_plain.keys() == g_ckpt.keys() and len(g_plain) > 5
    for name, g in g_plain.items():
        assert torch.allclose(g, g_ckpt[name], atol=1e-6, rtol=1e-5), name
    assert max(float(g.abs().max()) for g in g_plain.values()) > 0  # not vacuous


def test_bf16_compute_keeps_float32_master_weights_and_a_small_step_moves_them(tiny):
    path, exp = tiny
    model = build_policy(path, ModelConfig(dtype="bfloat16"), _rl())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, lr=1e-6)
    grads = grads_at_step(opt)
    update(model, opt, copy.deepcopy(exp), LearnerSettings(loss=Objective(kl_coef=0.0, max_len=6)))
    assert all(p.grad is None for p in model.parameters())  # freed after the step: not held through sampling
    state = next(iter(opt.state.values()))
    assert state["exp_avg"].dtype == torch.float32 and state["exp_avg_sq"].dtype == torch.float32
    got, changed = 0, 0
    for n, p in model.named_parameters():
        nonzero = grads[id(p)] != 0 if id(p) in grads else torch.zeros_like(p, dtype=torch.bool)  # a gradient reached
        got += int(nonzero.sum())
        changed += int((p.detach() != before[n])[nonzero].sum())
    assert got > 1000
    assert changed / got > 0.9, f"only {changed / got:.1%} of the weights with a gradient changed"


def test_the_forward_runs_in_bf16_under_autocast(tiny):
    from hindsight.maths.logprobs import compute_autocast

    path, _ = tiny
    model = build_policy(path, ModelConfig(dtype="bfloat16"), _rl())
    with compute_autocast(model):
        out = model(input_ids=torch.tensor([[5, 6, 7]])).logits
    assert out.dtype == torch.bfloat16


def test_bf16_weights_under_a_plain_optimizer_are_refused_naming_the_key():
    with pytest.raises(Exception, match="master_dtype") as err:
        PipelineConfig.model_validate({"model": {"master_dtype": "bfloat16"}})
    assert "float32 master weights" in str(err.value)
    with pytest.raises(ConfigError, match="model.master_dtype"):
        from hindsight.config import load_config
        import tempfile
        from pathlib import Path

        cfg = Path(tempfile.mkdtemp()) / "c.yaml"
        cfg.write_text("model:\n  master_dtype: bfloat16\n")
        load_config(cfg)
