import math

import pytest

from hindsight.errors import RewardError
from hindsight.scoring.rewards import load_reward_fn, score_completions
from rewards.exact import exact_answer
from rewards.format import number_only, regex_reward, think_answer_format
from rewards.math import math_answer


def test_exact_answer():
    assert exact_answer(["53", " 53 pens", "43", "", [{"role": "assistant", "content": "53"}]], ["53"] * 5) == \
        [1.0, 1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("pred,gold,ok", [
    (r"so \boxed{\frac{1}{2}}", "1/2", True),
    ("0.5", r"\frac{1}{2}", True),
    ("x=2 or x=3", "x=3 or x=2", True),
    ("x = 3, x = 2", "x=2 or x=3", True),
    ("x=2 or x=4", "x=2 or x=3", False),
    (r"\boxed{42}", "Natalia sold 48/2 = 24 clips...\n#### 42", True),
    (r"\boxed{41}", "#### 42", False),
    (r"$\sqrt{4}$", "2", True),
])
def test_math_answer_symbolic_equivalence(pred, gold, ok):
    assert math_answer([pred], [gold]) == [1.0 if ok else 0.0]


def test_format_rewards():
    assert think_answer_format(["<think>a</think><answer>1</answer>", "<answer>1</answer>"]) == [1.0, 0.0]
    assert number_only(["53", "53 pens"]) == [1.0, 0.0]
    assert regex_reward(["step 1: x"], pattern=r"step \d+:") == [1.0]


def _raises(completions, **_):
    raise RuntimeError("boom")


def _nan(completions, **_):
    return [math.nan, 1.0]


def _short(completions, **_):
    return [1.0]


def test_scoring_weights_and_fallbacks(monkeypatch):
    import sys
    import types

    mod = types.ModuleType("fake_rewards")
    mod.raises, mod.nan, mod.short = _raises, _nan, _short
    monkeypatch.setitem(sys.modules, "fake_rewards", mod)
    res = score_completions([("rewards.exact:exact_answer", 2.0), ("fake_rewards:nan", 1.0)],
                            ["53", "43"], {"answer": ["53", "53"]}, fallback=-1.0)
    assert res.total == [2.0 - 1.0, 0.0 + 1.0]
    assert res.failures == {"exact_answer": 0, "nan": 1}
    res = score_completions([("fake_rewards:raises", 1.0)], ["a", "b"], {}, fallback=0.5)
    assert res.total == [0.5, 0.5] and res.failures == {"raises": 2}
    with pytest.raises(RewardError, match="returned 1 scores for 2 completions"):
        score_completions([("fake_rewards:short", 1.0)], ["a", "b"], {})


def test_unimportable_reward_is_a_clear_error():
    with pytest.raises(RewardError, match="cannot import module 'no_such_mod'"):
        load_reward_fn("no_such_mod:f")
    with pytest.raises(RewardError, match="has no function 'nope'"):
        load_reward_fn("rewards.exact:nope")
    with pytest.raises(RewardError, match="expected 'module:function'"):
        load_reward_fn("rewards.exact")


@pytest.mark.integration  # a reward worker process
def test_reward_worker_bounds_a_hanging_reward_and_recovers(tmp_path, monkeypatch):
    import time

    from hindsight.scoring.guarded import RewardWorker

    (tmp_path / "slow_rewards.py").write_text(
        "import time, math\n"
        "def hang(completions, **_):\n    time.sleep(3600)\n"
        "def boom(completions, **_):\n    raise ValueError('bad reward')\n"
        "def nan(completions, **_):\n    return [math.nan for _ in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    worker = RewardWorker()
    try:
        t0 = time.monotonic()
        res = score_completions([("slow_rewards:hang", 1.0)], ["a", "b"], {}, fallback=-1.0, worker=worker, timeout_s=2)
        assert time.monotonic() - t0 < 6  # the hang cost its timeout, not forever
        assert res.total == [-1.0, -1.0] and res.failures == {"hang": 2}
        res = score_completions([("slow_rewards:boom", 1.0), ("rewards.exact:exact_answer", 1.0)], ["53", "4"],
                                {"answer": ["53", "53"]}, fallback=0.0, worker=worker, timeout_s=10)
        assert res.total == [1.0, 0.0] and res.failures == {"boom": 2, "exact_answer": 0}
        res = score_completions([("slow_rewards:nan", 1.0)], ["a"], {}, fallback=0.25, worker=worker, timeout_s=10)
        assert res.total == [0.25] and res.failures == {"nan": 1}
    finally:
        worker.close()
