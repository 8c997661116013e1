"""None of the hostile programs escapes the sandbox, and none forges a pass.

Each runs through the code reward (`code_tests`) exactly as RL scoring calls it. Besides its
score, each test checks the host afterwards: the sentinel process lives, no file appeared,
the project is unchanged, no socket got a byte, and no process of the sandbox's uids is left.
"""
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from rewards.code import code_tests
from rewards.sandbox import Limits, isolation_problem, run_python
from rewards.uids import is_claimed
from tests.sandbox.hostile import ADD, PROGRAMS, TEST

ROOT = Path(__file__).resolve().parents[2]
UID_BASE = 61000


def _tree_hash() -> str:
    h = hashlib.sha256()
    for p in sorted((ROOT / "rewards").glob("*.py")):
        h.update(p.read_bytes())
    return h.hexdigest()


def _sandbox_processes() -> list[int]:
    """Live host pids running as one of the sandbox's uids. Zombies are dead already: bwrap's
    namespace init is reparented to the host's pid 1 as it exits, which reaps it a moment later."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if UID_BASE <= uid < UID_BASE + 4096 and state != "Z":
                out.append(int(entry))
    return out


def _leftover_sandbox_processes() -> list[int]:
    """Sandbox processes whose run has ended: their uid is not claimed by a live sandbox (a run
    holds its uid's claim until its processes are killed). Another test process's sandboxes,
    running at the same time under pytest-xdist, hold theirs, so they are not counted."""
    out = []
    for pid in _sandbox_processes():
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except FileNotFoundError:
            continue
        if not is_claimed(uid):  # nobody holds it: the run that used it is over
            out.append(pid)
    return out


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """Things on the host a program tries to reach: a sentinel process, a unix and a TCP server."""
    assert isolation_problem() is None, isolation_problem()
    tmp = tmp_path_factory.mktemp("host")
    sentinel = subprocess.Popen(["sleep", "600"])
    received = []
    unix_path = str(tmp / "host.sock")
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(unix_path)
    os.chmod(unix_path, 0o777)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    for server in (unix, tcp):
        server.listen(8)
        threading.Thread(target=_serve, args=(server, received), daemon=True).start()
    yield {"sentinel": sentinel, "received": received, "UNIX_SOCKET": unix_path, "TCP_PORT": tcp.getsockname()[1]}
    sentinel.kill()
    unix.close()
    tcp.close()


def _serve(server, received):
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        received.append(conn.recv(100))


def _aimed(program: str, host) -> tuple[str, str]:
    """The program with the host facts it attacks filled in, and the mark it tries to leave."""
    mark = f"hindsight-escape-{uuid.uuid4().hex[:8]}"
    return (program.replace("{ROOT}", str(ROOT)).replace("{SENTINEL_PID}", str(host["sentinel"].pid))
            .replace("{UNIX_SOCKET}", host["UNIX_SOCKET"]).replace("{TCP_PORT}", str(host["TCP_PORT"]))
            .replace("{MARK}", mark)), mark


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_hostile_program(name, host, monkeypatch):
    program, tests, expected = PROGRAMS[name]
    program, mark = _aimed(program, host)
    monkeypatch.setenv("HINDSIGHT_TEST_SECRET", "hunter2")
    before = _tree_hash()

    score = code_tests([f"```python\n{program}\n```"], [tests], timeout_s=5, cpu_s=3, memory_mb=256, processes=16,
                       output_bytes=1 << 20)

    assert score == [expected]
    _assert_host_untouched(host, mark, before)


def _assert_host_untouched(host, mark: str, before: str) -> None:
    assert host["sentinel"].poll() is None, "a host process was killed"
    assert _tree_hash() == before, "the project's source changed"
    assert not any(mark.encode() in r for r in host["received"]), "a host socket received data"
    assert not list(Path("/tmp").glob(f"{mark}*")) and not Path(f"/usr/{mark}").exists()
    assert _leftover_sandbox_processes() == [], "a process of the sandbox outlived its run"


def test_there_are_at_least_twenty_hostile_programs():
    attacks = [n for n in PROGRAMS if not n.startswith("control-")]
    assert len(attacks) >= 20, attacks


def test_the_timeout_is_per_completion_so_a_sleeper_does_not_zero_its_batch():
    sleeper = "```python\nimport time\ntime.sleep(120)\n" + ADD + "```"
    correct = f"```python\n{ADD}```"
    scores = code_tests([sleeper, correct, correct, correct], [TEST] * 4, timeout_s=2, parallel=2)
    assert scores == [0.0, 1.0, 1.0, 1.0]


def test_an_output_flood_is_cut_at_the_cap_and_reported():
    res = run_python("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", Limits(output_bytes=1 << 16))
    assert res.output_truncated and len(res.stdout) <= 1 << 16


def test_a_killed_reward_worker_leaves_no_sandbox_behind(tmp_path):
    """The worker (the sandbox's parent) dies mid-run: bubblewrap's die-with-parent takes the tree."""
    script = ("from rewards.sandbox import run_python, Limits\n"
              "run_python('import os, time\\nos.fork(); os.fork()\\ntime.sleep(120)', Limits(timeout_s=120))\n")
    worker = subprocess.Popen([os.environ.get("PYTHON", "python"), "-c", script], cwd=ROOT)
    for _ in range(100):
        if len(_sandbox_processes()) >= 4:
            break
        time.sleep(0.1)
    assert len(_sandbox_processes()) >= 4, "the sandbox did not start"
    worker.kill()
    worker.wait()
    for _ in range(50):
        if not _leftover_sandbox_processes():
            break
        time.sleep(0.1)
    assert _leftover_sandbox_processes() == []


def test_the_sandbox_runs_as_an_unprivileged_uid_outside_the_namespace_too():
    res = run_python("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\n")
    uid, gid, groups = res.stdout.split(" ", 2)
    if os.geteuid() == 0:
        assert int(uid) >= UID_BASE and int(gid) >= UID_BASE and groups.strip() == "[]"
    else:
        assert int(uid) == os.geteuid()


WHO_LONG = ("import subprocess, sys\nfrom rewards.sandbox import Limits, run_python\n"
            "print(run_python('import os, time\\nprint(os.getuid(), flush=True)\\ntime.sleep(4)\\n', "
            "Limits(timeout_s=20)).stdout.strip(), flush=True)\n")


def test_two_processes_sandboxes_at_once_run_as_two_uids():
    """Each process used to count uids from the same first one: two reward workers' programs ran
    as one user, sharing its process limit and able to signal each other."""
    other = subprocess.Popen([sys.executable, "-c", WHO_LONG], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(100):  # until the other's program is running
            if _sandbox_processes() or other.poll() is not None:
                break
            time.sleep(0.1)
        mine = int(run_python("import os\nprint(os.getuid())\n").stdout)
        theirs = int(other.communicate(timeout=60)[0])
    finally:
        other.kill()
    if os.geteuid() == 0:
        assert mine != theirs and min(mine, theirs) >= UID_BASE
    else:
        assert mine == theirs == os.geteuid()


def test_every_forging_family_scores_zero_through_the_rl_scoring_path():
    """The same programs as RL scores them: `score_completions` with the reward worker process."""
    from hindsight.config.rl import RewardFnConfig
    from hindsight.scoring.guarded import RewardWorker
    from hindsight.scoring.rewards import score_completions

    names = sorted(n for n in PROGRAMS if n.startswith(("always-equal-vs-", "forged-answers-vs-", "correct-")))
    completions = [f"```python\n{PROGRAMS[n][0]}\n```" for n in names]
    spec = RewardFnConfig.model_validate({"fn": "rewards.code:code_tests", "args": {"timeout_s": 5, "parallel": 2}})
    worker = RewardWorker()
    try:
        result = score_completions([spec], completions, {"tests": [PROGRAMS[n][1] for n in names]}, -1.0, worker, 300)
    finally:
        worker.close()
    assert dict(zip(names, result.total)) == {n: PROGRAMS[n][2] for n in names}
    assert result.failures == {"code_tests": 0}


# the families that attack the host rather than the verdict, handed to the multi-turn python tool
TOOL_FAMILIES = ["read-project-source", "edit-a-reward-module", "write-outside-tmp", "disk-fill", "fork-bomb",
                 "memory-bomb", "kill-a-host-process", "kill-everything", "kill-parent", "tcp-to-host-loopback",
                 "unix-socket-on-host", "read-host-secrets-from-env", "read-etc-shadow", "detached-child",
                 "output-flood", "setuid-root"]


@pytest.mark.parametrize("name", TOOL_FAMILIES)
def test_a_hostile_program_given_to_the_python_tool_is_contained(name, host, monkeypatch):
    """Multi-turn: the model calls the built-in `python` tool with a hostile program. The call
    comes back as a turn (an answer or an error, never an exception), and the host is untouched."""
    from rewards.sandbox import Limits as ToolLimits

    from rewards.tools import ToolSandbox
    from hindsight.rollout.multiturn.tools import Tool, ToolCall, Toolbox

    program = PROGRAMS[name][0]
    program, mark = _aimed(program, host)
    monkeypatch.setenv("HINDSIGHT_TEST_SECRET", "hunter2")
    before = _tree_hash()
    box = ToolSandbox(ToolLimits(timeout_s=5, cpu_s=3, memory_mb=256, processes=16, output_bytes=1 << 16))
    tools = Toolbox([Tool(box.python_tool(5.0), "test", "in_process", 60.0)])

    turn = tools.call(ToolCall("python", {"code": program}))

    assert isinstance(turn.content, str) and "hunter2" not in turn.content
    _assert_host_untouched(host, mark, before)


def test_a_hanging_python_tool_call_is_an_error_turn_after_its_timeout():
    from rewards.tools import ToolSandbox
    from hindsight.rollout.multiturn.tools import Tool, ToolCall, Toolbox

    tools = Toolbox([Tool(ToolSandbox().python_tool(2.0), "test", "in_process", 60.0)])
    turn = tools.call(ToolCall("python", {"code": "import time\ntime.sleep(120)\n"}))
    assert turn.error and "ran past 2 s" in turn.content and turn.seconds < 30
    assert _leftover_sandbox_processes() == []
