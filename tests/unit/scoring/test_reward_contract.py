"""Rewards are called as TRL calls them (issue 13, defect 9): by keyword with prompts=,
completions=, completion_ids= and the dataset columns, plus per-reward args from the YAML;
their metrics are keyed by unique names; evaluation goes through the same guarded scoring."""
import pytest
import torch
from trl.rewards import get_soft_overlong_punishment

from hindsight.config import PipelineConfig
from hindsight.data.demo import build_demo_data
from hindsight.scoring.evaluate import accuracy
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.tiny import build_tiny_model
from hindsight.coordination.run import RLRun
from hindsight.scoring.rewards import reward_calls, score_completions

# TRL's own reward, unchanged: it reads only `completion_ids`, by keyword
overlong = get_soft_overlong_punishment(max_completion_len=4, soft_punish_cache=2)
SEEN = {}


def trl_style(prompts, completions, **kwargs):
    """A reward written for TRL's GRPOTrainer: prompts first, positionally named."""
    SEEN["prompts"], SEEN["completions"], SEEN["kwargs"] = prompts, completions, kwargs
    return [float(len(p) > 0) for p in prompts]


def raises(completions, **_):
    raise RuntimeError("the judge broke")


@pytest.fixture(scope="module")
def init(tmp_path_factory):
    work = tmp_path_factory.mktemp("contract")
    build_demo_data(work / "data", seed=0)
    return work, str(build_tiny_model(work / "init", hidden=32, layers=1, heads=2))


def _run(work, init, tmp_path, rewards):
    cfg = PipelineConfig.model_validate({
        "name": "r", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
        "rl": {"steps": 1, "prompts_per_step": 2, "samples_per_prompt": 3, "rollout": {"max_new_tokens": 6},
               "scoring": {"isolation": "inline", "rewards": rewards}}})
    run = RLRun(cfg, init, None)
    run.rollout(0), run.score(0)
    return run


def test_trls_own_reward_runs_unchanged_on_token_ids(init, tmp_path):
    run = _run(*init, tmp_path, [{"fn": "test_reward_contract:overlong"}])
    rows, scores = run.store.read("rollouts", 0), run.store.read("scores", 0)
    expected = overlong(completion_ids=[r["completion_ids"] for r in rows])
    assert [s["reward_overlong"] for s in scores] == expected
    assert len(set(expected)) > 1 or expected[0] != 0.0, "lengths gave one value only: the check proves little"
    run.close()


def test_a_trl_style_signature_gets_the_prompts_and_the_columns(init, tmp_path):
    run = _run(*init, tmp_path, [{"fn": "test_reward_contract:trl_style"}])
    rows = run.store.read("rollouts", 0)
    assert SEEN["prompts"] == [r["prompt"] for r in rows]
    assert SEEN["completions"] == [r["completion"] for r in rows]
    assert SEEN["kwargs"]["completion_ids"] == [list(r["completion_ids"]) for r in rows]
    assert SEEN["kwargs"]["answer"] and "prompt" not in SEEN["kwargs"]
    run.close()


def test_per_reward_args_and_unique_metric_names():
    calls = reward_calls([("rewards.format:regex_reward", 1.0, {"pattern": r"^4\d$"}),
                          ("rewards.format:regex_reward", 2.0, {"pattern": r"^\d$"})])
    assert [c.name for c in calls] == ["regex_reward", "regex_reward_2"]
    res = score_completions(calls, ["43", "7"], {})
    assert res.per_fn == {"regex_reward": [1.0, 0.0], "regex_reward_2": [0.0, 1.0]}
    assert res.total == [1.0, 2.0]


def test_yaml_args_reach_the_reward(tmp_path):
    cfg = PipelineConfig.model_validate({"rl": {"scoring": {"rewards": [
        {"fn": "rewards.format:regex_reward", "args": {"pattern": "^x$"}, "name": "just_x"}]}}})
    res = score_completions(cfg.rl.scoring.rewards, ["x", "y"], {})
    assert res.per_fn == {"just_x": [1.0, 0.0]}


def first_fails(completions, **_):
    return [None] + [0.0] * (len(completions) - 1)


def test_evaluation_uses_the_guarded_scoring(init, monkeypatch):
    from hindsight.errors import RewardError

    work, path = init
    rows = [{"prompt": "Ann has 40 pens", "answer": "53"}, {"prompt": "Bob has 10 cats", "answer": "11"}]
    model, tok = load_causal_lm(path), load_tokenizer(path)
    acc, answers = accuracy(model, tok, rows, "test_reward_contract:first_fails", 4, fallback=0.0)
    assert acc == 0.0 and len(answers) == 2  # one failed call cost its score, not the stage
    acc, _ = accuracy(model, tok, rows, "test_reward_contract:first_fails", 4, fallback=1.0)
    assert acc == 0.5  # the configured fallback, not a hard-coded zero
    # a judge that fails on every answer would report the fallback as an accuracy: it stops instead
    with pytest.raises(RewardError, match="eval.reward test_reward_contract:raises failed on all 2 eval answers: "
                                          "raised RuntimeError: the judge broke"):
        accuracy(model, tok, rows, "test_reward_contract:raises", 4, fallback=1.0)
    assert torch.is_grad_enabled()
