"""Adding an estimator is one class: registered from this test, it is accepted by the config
(name and settings block), trains through the unchanged learner and RL stage, and its
advantages are the ones stored with the rollout."""
import pytest
import torch
from pydantic import Field

from hindsight.learning.algorithms import ALGORITHMS, register, unregister
from hindsight.learning.algorithms.base import AdvantageInputs, Algorithm, AlgorithmSettings
from hindsight.config import PipelineConfig, load_config
from hindsight.data.demo import build_demo_data
from hindsight.errors import ConfigError
from hindsight.models.tiny import build_tiny_model
from hindsight.coordination.run import RLRun


class SignSettings(AlgorithmSettings):
    scale: float = Field(1.0, gt=0)


class SignAdvantage(Algorithm):
    """+scale above the group mean, -scale below, 0 on the mean."""
    name = "test_sign"
    Settings = SignSettings
    min_group_size = 2

    @staticmethod
    def advantages(x: AdvantageInputs, s: SignSettings):
        grouped = x.rewards.view(-1, x.group_size)                                      # (G, S)
        return (s.scale * torch.sign(grouped - grouped.mean(1, keepdim=True))).reshape(-1), None  # (B,)


@pytest.fixture
def sign_algorithm():
    register(SignAdvantage)
    yield SignAdvantage
    unregister(SignAdvantage.name)


def varied_reward(completions, **_):
    return [float(len(c) % 3) for c in completions]


def test_a_registered_estimator_trains_through_the_unchanged_rl_stage(sign_algorithm, tmp_path):
    build_demo_data(tmp_path / "data", seed=0)
    init = str(build_tiny_model(tmp_path / "init", hidden=32, layers=1, heads=2))
    cfg = PipelineConfig.model_validate({
        "name": "sign", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(tmp_path / "data"), "dvc_file": None, "prompts": str(tmp_path / "data/prompts.jsonl")},
        "rl": {"algorithm": "test_sign", "test_sign": {"scale": 2.5}, "steps": 1, "prompts_per_step": 4,
               "samples_per_prompt": 4, "rollout": {"max_new_tokens": 4},
               "scoring": {"isolation": "inline", "rewards": [{"fn": "test_algorithm_registry:varied_reward"}]}}})
    assert cfg.rl.algorithm_settings() == SignSettings(scale=2.5)
    run = RLRun(cfg, init, None)
    before = [p.detach().clone() for p in run.policy.parameters()]
    run.rollout(0), run.score(0)
    metrics = run.update(0)
    assert any(not torch.equal(a, b) for a, b in zip(before, run.policy.parameters()))
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    rewards = torch.tensor([s["reward"] for s in run.store.read("scores", 0)]).view(4, 4)
    expected = 2.5 * torch.sign(rewards - rewards.mean(1, keepdim=True))
    stored = torch.tensor([a["advantage"] for a in run.store.read("advantages", 0)]).view(4, 4)
    torch.testing.assert_close(stored, expected)
    assert expected.abs().sum() > 0, "the reward gave no signal, so the test would prove nothing"
    run.close()


def test_its_settings_block_is_validated_with_file_line_and_field(sign_algorithm, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rl:\n  algorithm: test_sign\n  test_sign:\n    scale: -1\n")
    with pytest.raises(ConfigError, match=r"c.yaml:4: rl.test_sign.scale: Input should be greater than 0"):
        load_config(path)
    path.write_text("rl:\n  algorithm: test_sign\n  samples_per_prompt: 1\n")
    with pytest.raises(ConfigError, match=r"rl.samples_per_prompt: .*test_sign .*at least 2 \(got 1\)"):
        load_config(path)


def test_unregistered_names_and_blocks_are_refused(tmp_path):
    assert "test_sign" not in ALGORITHMS
    path = tmp_path / "c.yaml"
    path.write_text("rl:\n  algorithm: test_sign\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: rl.algorithm: .*unknown algorithm 'test_sign'; registered: "
                                          r"grpo, ppo, reinforce_pp, rloo"):
        load_config(path)
    path.write_text("rl:\n  test_sign: {scale: 2}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: rl.test_sign: unknown key"):
        load_config(path)


def test_builtin_blocks_keep_their_settings_and_defaults():
    cfg = PipelineConfig.model_validate({"rl": {"algorithm": "ppo", "ppo": {"lam": 0.5}, "grpo": {"scale_rewards": "none"}}})
    assert cfg.rl.algorithm_settings().lam == 0.5 and cfg.rl.grpo.scale_rewards == "none"
    shown = PipelineConfig().rl.model_dump()["grpo"]  # the chosen block is always shown
    assert shown == {"scale_rewards": "group", "multi_objective": "sum_then_normalize"}
    again = PipelineConfig.model_validate(cfg.model_dump(by_alias=True))  # how Prefect hands a config to a flow run
    assert again.rl.algorithm_settings() == cfg.rl.algorithm_settings()
