"""Adding a policy loss is one class and its registration (docs/design.md): a loss defined here,
in a test, is taken by the config with its own block, refused with another's keys, and trained."""
import copy

import pytest
import torch
from pydantic import Field

from hindsight.config import PipelineConfig
from hindsight.learning.losses.base import LOSSES, LossInputs, PolicyLoss, RatioSettings
from hindsight.learning.update import learner_settings, update
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.tiny import build_tiny_model
from hindsight.rollout.hf import sample_groups


class CappedSettings(RatioSettings):
    cap: float = Field(2.0, gt=0)


class Capped(PolicyLoss):
    name = "test_capped"
    Settings = CappedSettings
    aggregation = "token_mean"

    @staticmethod
    def per_token(x: LossInputs, s: CappedSettings):
        ratio = torch.exp(x.log_ratio)
        return -ratio.clamp(max=s.cap) * x.advantages, {"capped": ratio > s.cap}


@pytest.fixture
def registered():
    LOSSES.register(Capped)
    yield
    LOSSES.pop(Capped.name)


def test_a_loss_registered_in_a_test_is_configured_and_trained(registered, tmp_path):
    cfg = PipelineConfig.model_validate({"rl": {"learner": {"loss": "test_capped", "test_capped": {"cap": 1.5}}}})
    s = learner_settings(cfg.rl)
    assert s.loss.settings.cap == 1.5
    with pytest.raises(ValueError, match="test_capped.temperature_pos"):
        PipelineConfig.model_validate({"rl": {"learner": {"loss": "test_capped", "test_capped": {"temperature_pos": 1}}}})
    path = str(build_tiny_model(tmp_path / "m", hidden=32, layers=1, heads=2))
    model, tok = load_causal_lm(path), load_tokenizer(path)
    exp = sample_groups(model, tok, ["Ann has 4 pens", "Bob"], [1, 2], 4, 5)
    exp.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.5])
    before = copy.deepcopy(model.state_dict())
    m = update(model, torch.optim.AdamW(model.parameters(), lr=1e-3), exp, s)
    assert "capped" in m and m["grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_loss_is_registered_once():
    with pytest.raises(ValueError, match="registered twice"):
        LOSSES.register(type("Again", (PolicyLoss,), {"name": "grpo"}))
