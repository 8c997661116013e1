"""`rl.rollout.logprobs: learner`: the ratio's anchor is the update's own forward, not a forward run
before it. In a batch's one optimizer step that forward is the behaviour policy's, so the step
must equal the step anchored on a separate forward of the same weights (`budgeted_logprobs`, what
`logprobs: forward` stores), on a step with signal: with no engine gap, and with an engine whose
log-probs are pulled away and a correction that weighs and masks them. The gap it logs is the
same too, and so is the step cut into micro-batches and packed."""
import copy

import pytest
import torch

from hindsight.config import PipelineConfig
from hindsight.learning.correction import Correction
from hindsight.learning.losses.objective import Objective
from hindsight.learning.update import LearnerSettings, learner_settings, update
from hindsight.maths.logprobs import budgeted_logprobs
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.tiny import build_tiny_model
from hindsight.rollout.hf import sample_groups


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("m") / "m", hidden=32, layers=2, heads=2))
    model, tok = load_causal_lm(path), load_tokenizer(path)
    exp = sample_groups(model, tok, ["Ann has 4 pens", "Bob has 10 cats and", "Q: 3+4="], [1, 2, 3], 4, 9,
                        temperature=0.9, logprobs="decode")
    exp.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.5, 0.2, 0.9, 0.0, 0.3])
    g = torch.Generator().manual_seed(0)
    exp.engine_logprobs = (exp.logprobs + 0.4 * torch.randn(exp.logprobs.shape, generator=g)) * exp.completion_mask
    return path, exp


def _step(path, exp, anchor: str, correction: Correction, budget=None, packing="off", engine=True):
    exp = copy.deepcopy(exp)
    model = load_causal_lm(path)
    if not engine:
        exp.engine_logprobs = None
    if anchor == "stored":  # what `logprobs: forward` stores: a forward of the same weights before the update
        exp.logprobs = budgeted_logprobs(model, exp, 0.9, None) * exp.completion_mask
    else:  # what `logprobs: learner` stores: the engine's own (here the decoding's), never read as the anchor
        exp.logprobs = torch.full_like(exp.logprobs, -7.0) * exp.completion_mask
        if not engine:
            exp.engine_logprobs = None
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)  # SGD: the step is the gradient, unscaled
    s = LearnerSettings(temperature=0.9, loss=Objective(correction=correction), anchor=anchor,
                        micro_batch_tokens=budget, packing=packing)
    metrics = update(model, opt, exp, s)
    moved = [p.detach() - b for p, b in zip(model.parameters(), before)]
    return moved, metrics


CORRECTIONS = [Correction(level="none"), Correction(level="token", action="truncate", clip_min=0.8, clip_max=1.25),
               Correction(level="sequence", action="mask", clip_max=3.0)]


@pytest.mark.parametrize("correction", CORRECTIONS, ids=["none", "token-truncate", "sequence-mask"])
@pytest.mark.parametrize("budget,packing", [(None, "off"), (40, "off"), (40, "on")],
                         ids=["whole", "micro-batches", "packed"])
def test_the_step_anchor_equals_an_anchor_forward_of_the_same_weights(sampled, correction, budget, packing):
    path, exp = sampled
    stored, m_stored = _step(path, exp, "stored", correction, budget, packing)
    step, m_step = _step(path, exp, "step", correction, budget, packing)
    assert sum(float(d.abs().sum()) for d in stored) > 1e-3  # a step with signal
    for a, b in zip(stored, step):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for key in ("loss", "offpolicy/mismatch_kl_k1", "offpolicy/mismatch_kl_k3", "offpolicy/max_token_gap",
                "offpolicy/corrected_fraction", "ratio_mean"):
        assert m_step[key] == pytest.approx(m_stored[key], rel=1e-4, abs=1e-6), key
    assert m_step["offpolicy/mismatch_kl_k3"] > 1e-3  # the engine's gap was measured against the step's anchor
    if correction.level != "none":
        assert m_step["offpolicy/corrected_fraction"] > 0  # and the correction fired


def test_without_an_engine_side_the_stored_log_probs_are_the_engines(sampled):
    """hf with `logprobs: learner` and no copy: the decoding log-probs are the engine side; the gap is
    the float32 round-off between the decode and the learner's forward."""
    path, exp = sampled
    exp = copy.deepcopy(exp)
    exp.engine_logprobs = None
    model = load_causal_lm(path)
    m = update(model, torch.optim.SGD(model.parameters(), lr=0.1), exp,
               LearnerSettings(temperature=0.9, anchor="step"))
    assert 0 < m["offpolicy/max_token_gap"] < 1e-4
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def _cfg(**rl) -> dict:
    return {"data": {"dir": "d", "dvc_file": None, "build_demo": False},
            "rl": {"prompts_per_step": 2, "samples_per_prompt": 4, **rl}}


def test_the_config_sets_the_anchor_and_refuses_where_it_is_not_the_behaviour_policys():
    cfg = PipelineConfig.model_validate(_cfg(rollout={"logprobs": "learner"}))
    assert learner_settings(cfg.rl).anchor == "step"
    assert learner_settings(PipelineConfig.model_validate(_cfg()).rl).anchor == "stored"
    for bad, words in ((_cfg(rollout={"logprobs": "learner"}, learner={"num_iterations": 2}), "num_iterations 1"),
                       (_cfg(rollout={"logprobs": "learner"}, learner={"mini_batch_size": 4}), "one mini-batch"),
                       (_cfg(rollout={"logprobs": "learner"}, **{"async": {"max_staleness": 1}},
                             learner={"correction": {"level": "none"}}), "needs the correction")):
        with pytest.raises(ValueError, match=words):
            PipelineConfig.model_validate(bad)
