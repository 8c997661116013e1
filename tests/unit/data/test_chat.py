"""Conversational data (a `messages` column, or chat `prompt` / `chosen` / `rejected`) in every
stage, through the tokenizer's chat template as TRL does, on a tiny model whose template is
set in code."""
import json

import pytest

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

    from hindsight.learning.trainers import train_reward_model, train_sft

    sft_rows = [{"messages": _conversation(a, b, a + b)} for a in range(8) for b in range(4)]
    out = train_sft(chat_model, _write(tmp_path / "sft.jsonl", sft_rows), tmp_path / "sft", lr=1e-3, epochs=1,
                    batch_size=8, max_length=48, seed=0, max_steps=2)
    assert out["train/loss"] > 0 and (tmp_path / "sft" / "model.safetensors").exists()
    # what TRL is handed is conversational, so TRL applies the template (its own test, not ours)
    assert is_conversational(load_rows(str(tmp_path / "sft.jsonl"), required=("prompt", "completion"))[0])
    prefs = [{"chosen": _conversation(a, b, a + b), "rejected": _conversation(a, b, a + b + 1)}
             for a in range(8) for b in range(4)]
    out = train_reward_model(chat_model, _write(tmp_path / "prefs.jsonl", prefs), tmp_path / "rm", lr=1e-3, epochs=1,
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
        "rl": {"steps": 1, "prompts_per_step": 2, "samples_per_prompt": 2, "reward_isolation": "inline",
               "rollout": {"max_new_tokens": 3}, "rewards": [{"fn": "test_chat:record_reward"}]}})
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
