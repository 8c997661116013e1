"""Conversational data (a `messages` column, or chat `prompt` / `chosen` / `rejected`) in every
stage, through the tokenizer's chat template as TRL does, on a tiny model whose template is
set in code."""
import json

import pytest

from hindsight.config import DataConfig
from hindsight.data.chat import normalise_row, prompt_text
from hindsight.data.rows import load_rows
from hindsight.models.load import load_tokenizer
from hindsight.models.tiny import build_tiny_model

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("chat") / "m", hidden=32, layers=1, heads=2)
    tok = load_tokenizer(str(path))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(path)
    return str(path)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _conversation(a, b, answer=None):
    turns = [{"role": "system", "content": "add"}, {"role": "user", "content": f"{a} + {b} ="}]
    return turns + ([{"role": "assistant", "content": str(answer)}] if answer is not None else [])


def test_rows_are_normalised_to_the_columns_each_stage_reads():
    sft = normalise_row({"messages": _conversation(1, 2, 3)}, ("prompt", "completion"))
    assert sft["prompt"] == _conversation(1, 2) and sft["completion"] == [{"role": "assistant", "content": "3"}]
    rl = normalise_row({"messages": _conversation(1, 2), "answer": "3"}, ("prompt",))
    assert rl["prompt"] == _conversation(1, 2)
    pref = normalise_row({"chosen": _conversation(1, 2, 3), "rejected": _conversation(1, 2, 4)},
                         ("prompt", "chosen", "rejected"))
    assert pref["prompt"] == _conversation(1, 2) and pref["rejected"] == [{"role": "assistant", "content": "4"}]


def test_the_prompt_text_is_the_chat_template(chat_model):
    tok = load_tokenizer(chat_model)
    assert prompt_text(tok, _conversation(1, 2)) == "system: add\nuser: 1 + 2 =\nassistant: "
    assert prompt_text(tok, "plain text") == "plain text"


def test_sft_and_the_reward_model_train_on_conversations_through_trl(chat_model, tmp_path):
    from trl.data_utils import is_conversational

    from hindsight.trainers.supervised import train_reward_model, train_sft

    sft_rows = [{"messages": _conversation(a, b, a + b)} for a in range(8) for b in range(4)]
    sft = DataConfig(sft=_write(tmp_path / "sft.jsonl", sft_rows)).reading("sft")
    out = train_sft(chat_model, sft, tmp_path / "sft", lr=1e-3, epochs=1,
                    batch_size=8, max_length=48, seed=0, max_steps=2)
    assert out["train/loss"] > 0 and (tmp_path / "sft" / "model.safetensors").exists()
    # what TRL is handed is conversational, so TRL applies the template (its own test, not ours)
    assert is_conversational(load_rows(str(tmp_path / "sft.jsonl"), required=("prompt", "completion"))[0])
    prefs = [{"chosen": _conversation(a, b, a + b), "rejected": _conversation(a, b, a + b + 1)}
             for a in range(8) for b in range(4)]
    pairs = DataConfig(prefs=_write(tmp_path / "prefs.jsonl", prefs)).reading("prefs")
    out = train_reward_model(chat_model, pairs, tmp_path / "rm", lr=1e-3, epochs=1,
                             batch_size=8, max_length=48, seed=0, max_steps=2)
    assert out["train/loss"] > 0 and (tmp_path / "rm" / "model.safetensors").exists()
    assert is_conversational(load_rows(str(tmp_path / "prefs.jsonl"), required=("prompt", "chosen", "rejected"))[0])


seen: list = []


def record_reward(completions, prompts, **_):
    seen.append((completions, prompts))
    return [1.0 if c[0]["content"].strip() else 0.0 for c in completions]


def test_rl_samples_from_the_template_and_rewards_see_messages(chat_model, tmp_path):
    from hindsight.config import PipelineConfig
    from hindsight.scoring.evaluate import accuracy
    from hindsight.coordination.run import RLRun

    rows = [{"messages": _conversation(a, b), "answer": str(a + b), "id": f"p{a}{b}"} for a in range(4) for b in range(3)]
    prompts = _write(tmp_path / "prompts.jsonl", rows)
    cfg = PipelineConfig.model_validate({
        "name": "chat", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(tmp_path), "dvc_file": None, "build_demo": False, "prompts": prompts, "eval": prompts},
        "rl": {"steps": 1, "prompts_per_step": 2, "samples_per_prompt": 2, "rollout": {"max_new_tokens": 3},
               "scoring": {"isolation": "inline", "rewards": [{"fn": "test_chat:record_reward"}]}}})
    run = RLRun(cfg, chat_model, None)
    run.rollout(0)
    stored = run.store.read("rollouts", 0)
    tok = run.tok
    for r in stored:
        assert r["conversational"] and r["prompt"].startswith("system: add\nuser: ") and r["prompt"].endswith("assistant: ")
        assert r["prompt_ids"] == tok(r["prompt"], add_special_tokens=False)["input_ids"]
    run.score(0)
    completions, _ = seen[-1]
    assert all(c[0]["role"] == "assistant" for c in completions)  # as TRL passes conversational completions
    run.update(0)
    assert 0.0 <= accuracy(run.policy, tok, load_rows(prompts, required=("prompt",)), "rewards.exact:exact_answer", 3)[0] <= 1
    run.close()


# --- data.prompt_format: chat, and per-file column mappings ------------------------------------------

def _gsm8k(tmp_path):
    rows = [{"question": "Ann has 40 pens and gets 13 more. How many pens?", "answer": "40 + 13 = 53\n#### 53"},
            {"question": "Bob has 10 cats and finds 2 more. How many cats?", "answer": "10 + 2 = 12\n#### 12"}]
    return _write(tmp_path / "gsm8k.jsonl", rows)


def test_plain_text_prompts_become_user_turns_of_the_chat_template(tmp_path):
    from hindsight.models.tiny import build_chatml_tokenizer

    path = _gsm8k(tmp_path)
    d = DataConfig(prompts=path, columns={"prompts": {"question": "prompt"}}, prompt_format="chat",
                   system_prompt="Solve it. End with #### N.")
    rows = load_rows(**d.reading("prompts"))
    assert rows[0]["prompt"] == [{"role": "system", "content": "Solve it. End with #### N."},
                                 {"role": "user", "content": "Ann has 40 pens and gets 13 more. How many pens?"}]
    assert rows[0]["answer"].endswith("#### 53")  # the reward's column is left alone
    text = prompt_text(build_chatml_tokenizer(), rows[0]["prompt"])
    assert text.startswith("<|im_start|>system\nSolve it.") and text.endswith("<|im_start|>assistant\n")
    plain = load_rows(**DataConfig(prompts=path, columns={"question": "prompt"}).reading("prompts"))
    assert plain[0]["prompt"] == "Ann has 40 pens and gets 13 more. How many pens?"  # as_is: the default


def test_chat_format_makes_sft_and_preference_texts_assistant_turns(tmp_path):
    sft = _write(tmp_path / "sft.jsonl", [{"prompt": "Q: 1+1?", "completion": "2"}])
    prefs = _write(tmp_path / "prefs.jsonl", [{"prompt": "Q: 1+1?", "chosen": "2", "rejected": "3"}])
    d = DataConfig(sft=sft, prefs=prefs, prompt_format="chat")
    row = load_rows(**d.reading("sft"))[0]
    assert row["prompt"] == [{"role": "user", "content": "Q: 1+1?"}]
    assert row["completion"] == [{"role": "assistant", "content": "2"}]
    pair = load_rows(**d.reading("prefs"))[0]
    assert pair["chosen"] == [{"role": "assistant", "content": "2"}] and pair["rejected"][0]["content"] == "3"


def test_a_per_file_mapping_cannot_empty_another_files_column(tmp_path):
    """The reported failure: `answer: completion` for SFT also renamed the RL rows' `answer`, so
    the reward lost its column. Under the file's name it applies to that file only."""
    path = _gsm8k(tmp_path)
    d = DataConfig(prompts=path, sft=path, columns={"sft": {"question": "prompt", "answer": "completion"},
                                                    "prompts": {"question": "prompt"}})
    assert "answer" in load_rows(**d.reading("prompts"))[0]
    assert load_rows(**d.reading("sft"))[0]["completion"].endswith("#### 53")
    both = DataConfig(columns={"question": "prompt", "sft": {"answer": "completion"}})
    assert both.columns_for("sft") == {"question": "prompt", "answer": "completion"}
    assert both.columns_for("prompts") == {"question": "prompt"}


def test_a_mapping_under_a_name_that_is_no_file_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="columns.rl: a mapping for one file goes under the file's name"):
        DataConfig(columns={"rl": {"question": "prompt"}})
    with pytest.raises(ValidationError, match="set data.prompt_format: chat"):
        DataConfig(system_prompt="be brief")


def test_sft_on_conversations_and_plain_rl_prompts_give_one_warning_naming_both(tmp_path):
    from hindsight.config import PipelineConfig
    from hindsight.data.rows import format_mismatch

    sft = _write(tmp_path / "sft.jsonl", [{"messages": _conversation(1, 2, 3)}])
    path = _gsm8k(tmp_path)
    base = {"data": {"sft": sft, "prompts": path, "eval": path, "columns": {"question": "prompt"}}}
    warning = format_mismatch(PipelineConfig.model_validate(base))
    assert warning.startswith(f"SFT trained on chat prompts (data.sft: {sft}) but data.prompts ({path}) text and "
                              f"data.eval ({path}) text") and "data.prompt_format: chat" in warning
    chat = {"data": {**base["data"], "prompt_format": "chat"}}
    assert format_mismatch(PipelineConfig.model_validate(chat)) is None
    # RL from a model of the user's own (not SFT's output): nothing to compare against
    assert format_mismatch(PipelineConfig.model_validate({**base, "rl": {"init": "tiny://qwen2"}})) is None
