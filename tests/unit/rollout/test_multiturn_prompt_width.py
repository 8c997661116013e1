"""A multi-turn trajectory's first prompt carries its tools' schemas (the chat template renders
them into the system turn): the prompt-length preflight and the auto budget's width count them,
not only the user's prompt."""
import json
from types import SimpleNamespace

import pytest

from hindsight.config import PipelineConfig
from hindsight.data.bounds import check_prompt_lengths, longest_prompt
from hindsight.errors import DataError
from hindsight.models.load import load_tokenizer
from hindsight.models.source import resolve_model_path
from hindsight.rollout.multiturn.render import first_prompt, first_prompt_text
from hindsight.rollout.multiturn.tools import Tool
from hindsight.stage import check_prompts
from tests.unit.rollout.multiturn_envs import games

ROWS = [{"prompt": "What is 2+3?", "answer": "5"},
        {"prompt": [{"role": "user", "content": "What is 10+31? Use the tool."}], "answer": "41"}]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return resolve_model_path("tiny://qwen2-tools", tmp_path_factory.mktemp("models"))


def test_the_first_prompts_width_counts_the_tools_schemas(model):
    tok = load_tokenizer(model)
    schemas = [Tool(games.add, "t", "in_process", 5.0).schema]
    render = first_prompt_text(tok, schemas)
    width = longest_prompt(ROWS, tok, render)
    assert width == max(len(first_prompt(tok, r["prompt"], schemas, None)) for r in ROWS)  # what a trajectory starts from
    assert width > longest_prompt(ROWS, tok, first_prompt_text(tok, [])) + 20  # the schema's JSON
    check_prompt_lengths(ROWS, tok, width, "p.jsonl", "the cap", render)  # fits at exactly its width
    with pytest.raises(DataError, match=r"p.jsonl:2: the prompt is \d+ tokens, more than the"):
        check_prompt_lengths(ROWS, tok, width - 1, "p.jsonl", "the cap", render)


def test_the_preflight_refuses_a_prompt_that_fits_only_without_its_tools(model, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    tok = load_tokenizer(model)
    bare = longest_prompt(ROWS, tok, first_prompt_text(tok, []))

    def config(cap: int) -> PipelineConfig:
        return PipelineConfig.model_validate({
            "name": "t", "run_dir": str(tmp_path / "run"),
            "data": {"dir": str(tmp_path), "dvc_file": None, "build_demo": False, "prompts": str(prompts),
                     "max_prompt_tokens": cap},
            "rl": {"init": model, "rollout": {"multi_turn": {
                "tools": ["tests.unit.rollout.multiturn_envs.games:add"], "isolation": "in_process"}}}})

    spec = SimpleNamespace(name="rl", data=("prompts",))
    with pytest.raises(DataError, match=r"prompts.jsonl:\d: the prompt is \d+ tokens, more than the .* "
                                        r"data.max_prompt_tokens"):
        check_prompts(spec, config(bare + 5), {"rl.init": model})  # the bare prompts fit; with the schema they do not
    check_prompts(spec, config(bare + 500), {"rl.init": model})


def test_a_gym_run_on_a_model_without_a_chat_template_is_one_config_error(tmp_path):
    from hindsight.errors import ConfigError
    from hindsight.models.tiny import build_tiny_model

    plain = str(build_tiny_model(tmp_path / "plain", hidden=32, layers=1, heads=2))  # no chat template
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "Guess.", "secret": 3}) + "\n")
    cfg = PipelineConfig.model_validate({
        "name": "t", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(tmp_path), "dvc_file": None, "build_demo": False, "prompts": str(prompts)},
        "rl": {"init": plain, "rollout": {"multi_turn": {"gym": "tests.unit.rollout.multiturn_envs.games:GuessNumber"}}}})
    with pytest.raises(ConfigError, match="multi_turn.gym: .*no chat template"):
        check_prompts(SimpleNamespace(name="rl", data=("prompts",)), cfg, {"rl.init": plain})
