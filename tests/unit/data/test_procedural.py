"""Procedural data (`rg://`): the rows are reasoning-gym's for the seed, the hash split keeps
every eval question out of training, and the task's own verifier scores answers the way a
small instruct model writes them (`rewards.reasoning_gym`)."""
from __future__ import annotations

import json

import re

import pytest

from hindsight.data.procedural import held_out, load_procedural
from hindsight.errors import DataError
from rewards.reasoning_gym import extract_answer, rg_score

TASK = "rg://chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1&holdout=0.3"


def test_the_rows_are_reasoning_gyms_own_for_the_seed():
    import reasoning_gym

    rows = load_procedural("rg://chain_sum?size=5&seed=7&min_terms=2&max_terms=2")
    direct = reasoning_gym.create_dataset("chain_sum", size=5, seed=7, min_terms=2, max_terms=2)
    assert [r["prompt"] for r in rows] == [direct[i]["question"] for i in range(5)]
    assert [r["answer"] for r in rows] == [str(direct[i]["answer"]) for i in range(5)]
    assert json.loads(rows[0]["rg_entry"])["metadata"]["source_dataset"] == "chain_sum"
    assert rows == load_procedural("rg://chain_sum?size=5&seed=7&min_terms=2&max_terms=2")  # same every run


def test_the_split_keeps_eval_questions_out_of_training():
    # one-digit sums have about 200 distinct questions: seeds alone would overlap heavily
    train = load_procedural(f"{TASK}&size=300&seed=1&split=train")
    evals = load_procedural(f"{TASK}&size=40&seed=2&split=eval")
    assert len(train) == 300 and len(evals) == 40
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in evals}
    assert len({r["prompt"] for r in evals}) == 40  # eval questions are distinct
    assert all(held_out(r["prompt"], 0.3) for r in evals) and not any(held_out(r["prompt"], 0.3) for r in train)


@pytest.mark.parametrize("spec, why", [
    ("rg://chain_sum?seed=1", "size= must be given as an integer"),
    ("rg://chain_sum?size=4&seed=1&holdout=0.2", "needs both holdout="),
    ("rg://chain_sum?size=4&seed=1&holdout=1.5&split=eval", "needs both holdout="),
    ("rg://no_such_task?size=4&seed=1", "reasoning-gym cannot make it"),
    ("rg://?size=4&seed=1", "no task named"),
    ("rg://chain_sum?size=1000000000&seed=1", "size=1000000000 must be between 1 and 100,000 rows"),
    ("rg://chain_sum?size=4&seed=1&holdout=1e-7&split=eval", "asks for about 48,000,008 rows to find 4"),
    ("rg://chain_sum?size=4&seed=1&max_digits=1e308", "max_digits=1e+308 is beyond what a generator is asked"),
    ("rg://chain_sum?size=4&seed=1&max_digits=nan", "max_digits=nan is beyond"),
])
def test_a_bad_spec_is_one_error_naming_it(spec, why, monkeypatch):
    import reasoning_gym

    def refuse(*a, **k):  # each refusal comes before anything is generated
        raise AssertionError("generated")

    if "reasoning-gym cannot" not in why:
        monkeypatch.setattr(reasoning_gym, "create_dataset", refuse)
    with pytest.raises(DataError, match=re.escape(why)) as err:
        load_procedural(spec)
    assert spec in str(err.value)


@pytest.mark.parametrize("text, gold, answer", [
    ("So 3 + 4 = 7.", "7", "7"),
    ("<answer>12</answer> and then 99", "12", "12"),
    ("9 - 5 = 4\nThe answer is 4", "4", "4"),
    ("The total is -3, not 1,200", "-3", "1200"),  # the last number, commas dropped
    ("first line\nlast line", "cat", "last line"),
    ("", "7", ""),
])
def test_the_answer_is_the_tagged_one_else_the_last_number(text, gold, answer):
    assert extract_answer(text, gold) == answer


def test_rg_score_is_the_tasks_own_verdict():
    rows = load_procedural("rg://chain_sum?size=3&seed=4&min_terms=2&max_terms=2")
    right = [f"Adding up, we get {r['answer']}." for r in rows]
    wrong = [f"It is {int(r['answer']) + 1}." for r in rows]
    entries = [r["rg_entry"] for r in rows]
    assert rg_score(right, entries) == [1.0, 1.0, 1.0]
    assert rg_score(wrong, entries) == [0.0, 0.0, 0.0]
    chat = [[{"role": "assistant", "content": right[0]}]]  # TRL's conversational completions
    assert rg_score(chat, entries[:1]) == [1.0]


# --- a chat template renders under a budget (hindsight.data.template_guard) ----------------------
def test_a_template_past_its_time_or_memory_budget_is_one_error_naming_its_source():
    from hindsight.data.template_guard import check_template
    from hindsight.errors import ConfigError
    from hindsight.models.tiny import build_chatml_tokenizer

    tok = build_chatml_tokenizer()
    check_template(tok, "rl.init: good")  # a plain template renders
    tok.chat_template = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    with pytest.raises(ConfigError, match=r"rl.init: loop: its chat template did not render .* within 2 s"):
        check_template(tok, "rl.init: loop", timeout_s=2)
    tok.chat_template = "{{ 'x' * 3000000000 }}"
    with pytest.raises(ConfigError, match=r"rl.init: bomb: its chat template needed more than 256 MB"):
        check_template(tok, "rl.init: bomb", memory_mb=256)
