"""The GSM8K-format word problems (`data.demo: gsm8k_format`) and the recipe's reward file beside
its config: the working adds up, the split keeps eval numbers out of training, the files are
reproducible, and the reward reads only the number after `####`."""
import importlib.util
import json
import re
from collections import Counter
from pathlib import Path

from hindsight.data.wordproblems import KINDS, MAKERS, build_word_problems, held_out

ROOT = Path(__file__).resolve().parents[3]


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _numbers(question: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", question))


def _problem(row: dict) -> tuple:
    """A problem's kind (its operations) and numbers: a product and a quotient may share numbers."""
    return tuple(re.findall(r" ([-+*/]) ", row["answer"])), _numbers(row["question"])


def test_every_answer_works_out_line_by_line_and_ends_with_its_number(tmp_path):
    files = build_word_problems(tmp_path)
    for name in ("prompts.jsonl", "eval.jsonl", "sft.jsonl"):
        for row in _rows(files[name]):
            *steps, final = row["answer"].split("\n")
            for step in steps:  # "a op b = c", each checked by Python's arithmetic
                lhs, rhs = step.split(" = ")
                assert eval(lhs.replace("/", "//")) == int(rhs), step  # noqa: S307 (our own digits)
                a, op, b = lhs.split(" ")
                assert op != "/" or int(a) % int(b) == 0, step  # division is exact
            assert final == f"#### {steps[-1].split(' = ')[1]}"
            # the question holds the numbers the working starts from
            assert int(steps[0].split(" ")[0]) in _numbers(row["question"])


def test_sizes_kinds_and_a_split_by_numbers(tmp_path):
    files = build_word_problems(tmp_path, seed=3)
    sizes = {name: len(_rows(path)) for name, path in files.items()}
    assert sizes == {"prompts.jsonl": 600, "eval.jsonl": 200, "sft.jsonl": 300}
    evals = _rows(files["eval.jsonl"])
    trained = _rows(files["prompts.jsonl"]) + _rows(files["sft.jsonl"])
    # no held-out question's numbers appear among the trained ones
    assert not {_problem(r) for r in evals} & {_problem(r) for r in trained}
    assert len({r["question"] for r in trained}) == 900  # distinct questions
    # the five kinds in turn: 40 of each held out
    ops = Counter(" ".join(re.findall(r" ([-+*/]) ", r["answer"])) for r in evals)
    assert ops == {"+": 40, "-": 40, "*": 40, "/": 40, "* -": 40}


def test_same_seed_same_bytes_other_seed_other_rows(tmp_path):
    a, b, c = (build_word_problems(tmp_path / d, seed=s) for d, s in (("a", 0), ("b", 0), ("c", 1)))
    assert all(a[n].read_bytes() == b[n].read_bytes() for n in a)
    assert a["prompts.jsonl"].read_bytes() != c["prompts.jsonl"].read_bytes()


def test_held_out_is_a_quarter_of_the_keys():
    import random

    rng = random.Random(0)
    keys = [MAKERS[k](rng)[0] for k in KINDS for _ in range(400)]
    share = sum(map(held_out, keys)) / len(keys)
    assert 0.2 < share < 0.3, share


def _recipe_reward():
    spec = importlib.util.spec_from_file_location("gsm8k_reward", ROOT / "configs/examples/gsm8k_reward.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_recipe_reward_scores_only_the_number_after_the_last_marker():
    reward = _recipe_reward().final_answer
    gold = ["6 * 7 = 42\n#### 42"] * 6 + ["9 * 125 = 1125\n#### 1125"]
    completions = ["6 * 7 = 42\n#### 42",               # right
                   "6 * 7 = 42",                         # right number, no marker: cut or prose
                   "#### 41\n6 * 7 = 42\n#### 42",       # the last marker counts
                   "#### 42\nno, #### 24",               # ... both ways
                   [{"role": "assistant", "content": "#### 42.0"}],  # conversational, as a float
                   "####",                               # a marker without a number
                   "#### 1,125"]                         # thousands comma
    assert reward(completions=completions, answer=gold) == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
