"""Tools that end and say so: an in-process call past its timeout never holds the process; a gym
`step` runs under the same timeout and a failing one ends its trajectory; arguments are checked
against the method's hints and size bounds before it runs; a turn's calls are capped, and its
sandboxed calls run several at a time."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from hindsight.rollout.multiturn.arguments import Limits
from hindsight.rollout.multiturn.episodes import GymEpisode, ToolEpisode
from hindsight.rollout.multiturn.tools import ABANDONED, Tool, ToolCall, Toolbox

ROOT = Path(__file__).resolve().parents[3]


def test_a_hung_in_process_call_is_answered_and_never_holds_the_exit(tmp_path):
    """The process prints its last line and exits, though the tool sleeps on for 10 minutes
    (the thread pool's worker was joined at exit: the CLI stayed alive 120 s)."""
    script = tmp_path / "hung.py"
    script.write_text(textwrap.dedent("""
        import time
        from hindsight.rollout.multiturn.tools import ABANDONED, Tool, ToolCall, Toolbox

        def wait(seconds: int) -> str:
            \"\"\"Wait.

            Args:
                seconds: how long
            \"\"\"
            time.sleep(seconds)
            return "woke"

        result = Toolbox([Tool(wait, "t", "in_process", timeout_s=0.5)]).call(ToolCall("wait", {"seconds": 600}))
        print(result.error, result.content, ABANDONED["calls"], flush=True)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True error: TimeoutError: no answer within 0.5 s 1"


class Slow:
    def reset(self, **row):
        return "go"

    def step(self, text):
        threading.Event().wait(600)


class Broken:
    def reset(self, **row):
        return "go"

    def step(self, text):
        raise KeyError("the model's text is no move")


def test_a_gym_step_runs_under_the_timeout_and_a_failing_one_ends_the_trajectory():
    before = ABANDONED["calls"]
    assert GymEpisode(Slow(), timeout_s=0.3).respond("move", []) == ([], [], True)
    assert ABANDONED["calls"] == before + 1
    episode = GymEpisode(Broken(), timeout_s=5)
    assert episode.respond("move", []) == ([], [], True) and episode.reward() == 0.0


class Room:
    def reset(self, **row):
        return None

    def look(self, width: int, mode: str = "plain") -> str:
        """Look around.

        Args:
            width: how wide
            mode: how
        """
        return "x" * width


def test_environment_arguments_are_checked_before_the_call():
    episode = ToolEpisode([], Room(), "t", limits=Limits(max_chars=64, max_items=8, max_abs=1000))
    calls = [ToolCall("look", {"width": 10**9}), ToolCall("look", {"width": "wide"}),
             ToolCall("look", {"width": True}), ToolCall("look", {"width": 3, "mode": "y" * 100}),
             ToolCall("look", {"width": 3})]
    _, results, _ = episode.respond("", calls)
    assert [r.error for r in results] == [True, True, True, True, False]
    assert "beyond the 1000" in results[0].content and "is not int" in results[1].content
    assert "boolean" in results[2].content and "100 characters" in results[3].content
    assert results[4].content == "xxx"


class Meeting(Tool):
    """A sandboxed tool stand-in: each call waits until `at_once` calls are in at once."""

    def __init__(self, barrier, peak):
        def meet(n: int) -> str:
            """Meet.

            Args:
                n: which
            """
            return str(n)

        super().__init__(meet, "t", "sandbox")
        self.barrier, self.peak, self.lock, self.now = barrier, peak, threading.Lock(), 0

    def run(self, args: dict) -> str:
        with self.lock:
            self.now += 1
            self.peak.append(self.now)
        try:
            self.barrier.wait()  # broken (an error) unless `at_once` calls are running together
        finally:
            with self.lock:
                self.now -= 1
        return str(args["n"])


def test_a_turns_calls_are_capped_and_its_sandboxed_calls_run_at_once():
    peak: list[int] = []
    box = Toolbox([Meeting(threading.Barrier(4, timeout=30), peak)], max_calls=8, at_once=4)
    results = box.call_all([ToolCall("meet", {"n": i}) for i in range(11)])
    assert [r.content for r in results[:8]] == [str(i) for i in range(8)] and not any(r.error for r in results[:8])
    assert all(r.error and "only 8 calls a turn" in r.content for r in results[8:])
    assert max(peak) == 4
