"""The sandbox's limits and the judge's rules, each exercised by code that tries to break them."""
import logging
import time

import pytest

import rewards.code as code
import rewards.sandbox as sandbox
from rewards.code import code_tests, with_entry_point
from rewards.harness import CandidateError, Peer
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
    assert "allocated" not in res.stdout and [{k: a[k] for k in ("op", "ok", "error")} for a in res.answers] == [
        {"op": "started", "ok": False, "error": "MemoryError"}]


def test_runs_in_an_empty_private_tmp():
    res = run_python("import os\nprint(os.getcwd(), sorted(os.listdir('.')), sorted(os.listdir('/')))\n")
    assert res.stdout.split(" ", 1)[0] == "/tmp" and "[] " in res.stdout
    assert "'home'" not in res.stdout and "'etc'" not in res.stdout and "'work'" not in res.stdout


def test_the_tests_run_in_their_own_sandbox_and_only_arguments_reach_the_program():
    """The program logs every call it gets and searches its own memory for what the tests hold:
    the arguments arrive, the tests' source and expected values never do."""
    program = ("import gc\ncalls = []\ndef add(a, b):\n    calls.append([a, b])\n    return a + b\n"
               "def seen():\n    return calls\n"
               "def leaked():\n    return [o[:80] for o in gc.get_objects() if type(o) is str and 'EXPECT' + 'ED' in o]\n")
    tests = "EXPECTED = 123456\nassert add(2, 3) == 5\nassert add(1, 1) != EXPECTED\n" \
            "assert seen() == [[2, 3], [1, 1]]\nassert leaked() == []\n"
    assert code_tests([program], [tests]) == [1.0]
    assert code_tests([program], [tests.replace("[[2, 3], [1, 1]]", "[[2, 3]]")]) == [0.0]  # the check is real


def _peer() -> Peer:
    import os

    r, w = os.pipe()
    return Peer(w, r, "t0k3n", {})


@pytest.mark.parametrize("answer", [{"value": "__import__('os')"}, {"value": "5" * (2 << 20)}, {"value": 5}, {}])
def test_only_a_literal_of_builtin_types_comes_out(answer):
    peer = _peer()
    with pytest.raises(CandidateError):
        peer._result({"op": "answer", **answer}, "f")


def test_an_exception_crosses_as_its_builtin_type_with_its_message():
    peer = _peer()
    with pytest.raises(ValueError, match="negative"):
        peer._result({"op": "answer", "error": "ValueError", "message": "negative"}, "f")
    with pytest.raises(CandidateError, match="MyError"):  # not a built-in: no type of the program's is made here
        peer._result({"op": "answer", "error": "MyError", "message": "x"}, "f")
    assert list(peer._result({"op": "answer", "value": "[1, 2]", "iterator": True}, "f")) == [1, 2]


def test_an_argument_that_is_neither_plain_data_nor_callable_is_not_sent():
    program = "def f(g):\n    return 1\n"
    assert code_tests([program], ["assert f(object()) == 1"]) == [0.0]
    assert code_tests([program], ["assert f(lambda x: x) == 1"]) == [1.0]  # a function goes as a handle


def test_humaneval_tests_call_check_with_the_entry_point():
    tests = "def check(candidate):\n    assert candidate(1) == 2\n"
    assert with_entry_point(tests, "inc").endswith("\ncheck(inc)\n")
    assert with_entry_point(tests + "\ncheck(inc)\n", "inc").count("check(inc)") == 1  # already called
    assert with_entry_point("assert inc(1) == 2", "inc") == "assert inc(1) == 2"
    good, bad = "def inc(x):\n    return x + 1\n", "def inc(x):\n    return x\n"
    assert code_tests([good, bad], [tests, tests], entry_point=["inc", "inc"]) == [1.0, 0.0]


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


FORKS = ("import os, time\nkids = []\nfor i in range(6):\n    pid = os.fork()\n    if pid == 0:\n"
         "        x = bytearray(300 << 20)\n        for j in range(0, len(x), 4096):\n            x[j] = 1\n"
         "        time.sleep(2)\n        os._exit(0)\n    kids.append(pid)\n"
         "print(sum(os.waitpid(k, 0)[1] == 0 for k in kids), 'survived')\n")


def test_one_memory_limit_holds_for_the_whole_process_tree():
    """Six forks of 300 MB under memory_mb 512: each fits its own rlimit, together they do not."""
    res = run_python(FORKS, Limits(memory_mb=512, timeout_s=30))
    survived = int(res.stdout.split()[0])
    assert survived <= 1 and res.memory_killed
    alone = run_python(FORKS, Limits(memory_mb=512, timeout_s=30, memory_scope="process"))
    assert alone.stdout.split()[0] == "6" and not alone.memory_killed  # what the per-process rlimit allowed


def test_files_on_the_tmpfs_count_against_the_trees_memory():
    res = run_python("f = open('/tmp/big', 'wb')\nfor i in range(400):\n    f.write(b'x' * (1 << 20))\nprint('wrote')",
                     Limits(memory_mb=128, tmp_mb=1024, file_mb=1024, timeout_s=30))
    assert "wrote" not in res.stdout and res.memory_killed


def test_only_the_tmpfs_is_writable():
    probe = ("import os\nfor path in ['/x', '/dev/x', '/dev/shm/x', '/proc/x', '/usr/x', '/tmp/x']:\n"
             "    try:\n        open(path, 'wb').write(b'a' * 1000)\n        print(path, 'written')\n"
             "    except OSError as exc:\n        print(path, exc.errno)\n")
    lines = dict(line.split() for line in run_python(probe).stdout.splitlines())
    assert lines.pop("/tmp/x") == "written"
    assert all(v != "written" for v in lines.values()), lines


def test_without_a_memory_cgroup_the_code_reward_refuses_unless_told_otherwise(monkeypatch):
    from rewards import cgroup

    monkeypatch.setattr(cgroup, "problem", lambda: "no memory cgroup can be made here")
    with pytest.raises(SandboxUnavailable, match="no memory cgroup can be made here; set `args: {memory_scope: process}`"):
        code.preflight()
    assert code_tests(["def f():\n    return 1\n"], ["assert f() == 1"], memory_scope="process") == [1.0]


def test_the_sandboxs_memory_group_is_inside_the_jobs_own():
    """What the sandbox holds counts against the job's own memory limit too (a pod's, a container's)."""
    from rewards import cgroup

    kind, base = cgroup._base()
    own = cgroup._own_v1_path() if kind == "v1" else cgroup._own_v2_path()
    group = cgroup.MemoryGroup(64 << 20)
    try:
        assert group.path.parent == base and (base == own or (kind == "v2" and base == own.parent))
        if kind == "v1":
            assert base == own  # v1 allows groups under a folder that holds processes: always inside
    finally:
        group.close()


def test_the_kuberay_example_binds_the_dashboard_to_loopback():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs/deploy.md").read_text()
    assert "dashboard-host: 0.0.0.0" not in text and "rayStartParams: {dashboard-host: 127.0.0.1}" in text
