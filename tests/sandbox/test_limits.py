"""The sandbox's limits and the judge's rules, each exercised by code that tries to break them."""
import logging
import time

import pytest

import rewards.code as code
import rewards.sandbox as sandbox
from rewards.code import Check, code_tests, plan_tests, verdict
from rewards.sandbox import Limits, SandboxUnavailable, run_python


def test_passing_and_failing_code():
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    bad = "```python\ndef add(a, b):\n    return a - b\n```"
    assert code_tests([good, bad], ["assert add(2, 3) == 5"] * 2) == [1.0, 0.0]


def test_infinite_loop_is_stopped_by_the_cpu_limit():
    res = run_python("while True:\n    pass\n", Limits(timeout_s=60, cpu_s=1))
    assert not res.timed_out and res.returncode != 0  # SIGXCPU/SIGKILL, long before the wall timeout


def test_sleeping_forever_is_stopped_by_the_wall_timeout():
    t0 = time.monotonic()
    res = run_python("import time\ntime.sleep(3600)\n", Limits(timeout_s=1.5))
    assert res.timed_out and res.returncode is None and time.monotonic() - t0 < 60


def test_memory_bomb_is_stopped_by_the_memory_limit():
    res = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')\n", Limits(memory_mb=256))
    assert "allocated" not in res.stdout and res.answers == [{"i": -1, "error": "MemoryError"}]


def test_runs_in_an_empty_private_tmp():
    res = run_python("import os\nprint(os.getcwd(), sorted(os.listdir('.')), sorted(os.listdir('/')))\n")
    assert res.stdout.split(" ", 1)[0] == "/tmp" and "[] " in res.stdout
    assert "'home'" not in res.stdout and "'etc'" not in res.stdout and "'work'" not in res.stdout


def test_the_judge_splits_asserts_and_keeps_expected_values_out_of_the_sandbox():
    checks = plan_tests("import math\nassert f(2) == 4\nassert 9 > g(1)\nassert not h(3)\nassert math.isclose(f(1), 1)")
    assert checks == [Check("exec", "import math"), Check("eval", "f(2)", code.ast.Eq, 4),
                      Check("eval", "g(1)", code.ast.Lt, 9), Check("eval", "h(3)", negate=True),
                      Check("eval", "math.isclose(f(1), 1)")]
    assert all("4" not in c.source and "9" not in c.source for c in checks[1:3])


@pytest.mark.parametrize("answers, ok", [
    ([{"i": -1, "ok": True}, {"i": 0, "value": "4"}], True),
    ([{"i": -1, "ok": True}, {"i": 0, "value": "4.0"}], True),      # 4.0 == 4, as the assert would say
    ([{"i": -1, "ok": True}, {"i": 0, "value": "5"}], False),
    ([{"i": -1, "ok": True}, {"i": 0, "truth": True}], False),      # a compare needs the value itself
    ([{"i": -1, "ok": True}, {"i": 0, "value": "__import__('os')"}], False),  # not a literal
    ([{"i": -1, "ok": True}], False),                               # unanswered
    ([{"i": 0, "value": "4"}], False),                              # the program itself never finished
    ([{"i": -1, "ok": True}, {"i": 0, "error": "AssertionError"}], False),
])
def test_verdict(answers, ok):
    assert verdict([Check("eval", "f(2)", code.ast.Eq, 4)], answers) is ok


def test_without_bubblewrap_the_code_reward_refuses_unless_unsafe_local_is_set(monkeypatch, caplog):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.isolation_problem.cache_clear()
    code._warn_unsafe.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap.*sandbox: unsafe-local"):
            code.preflight()
        with pytest.raises(SandboxUnavailable):
            code_tests(["```python\nx = 1\n```"], ["assert x == 1"])
        with caplog.at_level(logging.WARNING, logger="rewards.code"):
            assert code_tests(["```python\nx = 1\n```"], ["assert x == 1"], sandbox="unsafe-local") == [1.0]
        assert "without filesystem, process, user or network isolation" in caplog.text
    finally:
        sandbox.isolation_problem.cache_clear()


def test_an_unknown_sandbox_mode_is_refused():
    with pytest.raises(ValueError, match="sandbox: 'docker' is not one of bwrap, unsafe-local"):
        code.preflight("docker")
