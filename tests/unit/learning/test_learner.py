"""The learner on the tiny model: the stored batch is really reused across iterations."""
import torch

from hindsight.learning.losses.objective import Objective
from hindsight.learning.update import LearnerSettings, update
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.tiny import build_tiny_model
from hindsight.rollout.decoding import completion_mask
from hindsight.rollout.hf import sample_groups


def test_completion_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 1, 7, 1], [5, 6, 7, 8]])
    assert completion_mask(ids, 1).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_second_iteration_uses_stored_behaviour_logprobs(tmp_path):
    path = build_tiny_model(tmp_path / "m", hidden=32, layers=1, heads=2)
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    exp = sample_groups(model, tok, ["Ann has 40 pens", "Bob has 10 cats"], [0, 1], 4, 4)
    exp.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    metrics = update(model, opt, exp, LearnerSettings(num_iterations=2, loss=Objective(kl_coef=0.0)))
    # first pass: same weights that sampled the batch, so the ratio is exactly 1
    assert abs(metrics["ratio_mean/iter0"] - 1.0) < 1e-5
    # second pass: the policy moved, the stored log-probs did not
    assert abs(metrics["ratio_mean/iter1"] - 1.0) > 1e-4
