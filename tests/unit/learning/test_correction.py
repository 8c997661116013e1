"""The off-policy correction through a real update: the sampler–learner gap it logs is 0 when the
engine's log-probs equal the learner's, and the mismatch KL and the corrected fraction rise as the
engine's log-probs are pulled further away."""
import copy

import pytest
import torch

from hindsight.learning.correction import Correction
from hindsight.learning.losses.objective import Objective
from hindsight.learning.update import LearnerSettings, update
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.tiny import build_tiny_model
from hindsight.rollout.hf import sample_groups


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("m") / "m", hidden=32, layers=1, heads=2))
    model, tok = load_causal_lm(path), load_tokenizer(path)
    exp = sample_groups(model, tok, ["Ann has 4 pens", "Bob has 10 cats"], [1, 2], 4, 6)
    exp.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.5])
    return path, exp


def _gap(path, exp, noise: float, correction: Correction) -> dict:
    exp = copy.deepcopy(exp)
    g = torch.Generator().manual_seed(0)
    exp.engine_logprobs = (exp.logprobs + noise * torch.randn(exp.logprobs.shape, generator=g)) * exp.completion_mask
    model = load_causal_lm(path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return update(model, opt, exp, LearnerSettings(loss=Objective(correction=correction)))


@pytest.mark.parametrize("correction", [Correction(level="sequence", action="mask", clip_max=3.0),
                                        Correction(level="token", action="truncate", clip_min=0.8, clip_max=1.25),
                                        Correction(level="geometric", action="mask", clip_min=0.99, clip_max=1.01)])
def test_the_gap_and_the_corrected_fraction_rise_with_the_engines_distance(sampled, correction):
    path, exp = sampled
    same = _gap(path, exp, 0.0, correction)
    assert same["offpolicy/mismatch_kl_k1"] == 0.0 and same["offpolicy/mismatch_kl_k3"] == 0.0
    assert same["offpolicy/max_token_gap"] == 0.0 and same["offpolicy/corrected_fraction"] == 0.0
    assert same["offpolicy/ratio_p01"] == same["offpolicy/ratio_p99"] == 1.0
    gaps = [_gap(path, exp, noise, correction) for noise in (0.05, 0.3, 1.0)]
    k3 = [m["offpolicy/mismatch_kl_k3"] for m in gaps]
    corrected = [m["offpolicy/corrected_fraction"] for m in gaps]
    assert 0 < k3[0] < k3[1] < k3[2]
    assert corrected[0] <= corrected[1] <= corrected[2] and corrected[2] > 0
    assert [m["offpolicy/max_token_gap"] for m in gaps] == sorted(m["offpolicy/max_token_gap"] for m in gaps)


def test_no_engine_log_probs_is_no_gap(sampled):
    """hf in a sync run: the behaviour log-probs are the learner's own forward."""
    path, exp = sampled
    model = load_causal_lm(path)
    m = update(model, torch.optim.AdamW(model.parameters(), lr=1e-4), copy.deepcopy(exp), LearnerSettings())
    assert m["offpolicy/mismatch_kl_k1"] == 0.0 and m["offpolicy/corrected_fraction"] == 0.0


def test_an_async_correction_anchors_on_the_learner_and_weighs_the_stale_log_probs(sampled):
    """Stored log-probs of a stale version (here: the learner's own, pulled away): with the
    correction on in an async run, the ratio is taken against the learner's forward at the step's
    start (so it is 1 on the first pass), and the stale log-probs become the engine's side."""
    path, exp = sampled
    stale = copy.deepcopy(exp)
    g = torch.Generator().manual_seed(3)
    stale.logprobs = (exp.logprobs + 0.5 * torch.randn(exp.logprobs.shape, generator=g)) * exp.completion_mask
    correction = Correction(level="token", action="truncate", clip_max=1.5, recompute_anchor=True)
    model = load_causal_lm(path)
    m = update(model, torch.optim.AdamW(model.parameters(), lr=1e-4), stale,
               LearnerSettings(loss=Objective(correction=correction)))
    assert abs(m["ratio_mean/iter0"] - 1.0) < 1e-5  # against the anchor, not the stale numbers
    torch.testing.assert_close(stale.logprobs, exp.logprobs, atol=1e-5, rtol=0)  # the anchor: the learner's forward
    assert m["offpolicy/mismatch_kl_k3"] > 0.05 and 0 < m["offpolicy/corrected_fraction"] < 1
