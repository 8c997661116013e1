"""The reward worker's heartbeat (issue 47): a worker that stops (SIGSTOP) is told apart from a
reward that is slow. The stopped one is replaced and the call made again, so the scores are the
ones an undisturbed worker returns; the slow one keeps its worker and meets its timeout."""
import os
import signal
import threading
import time

import pytest

from helpers import varied
from hindsight.scoring.guarded import RewardTimeout, RewardWorker

COMPLETIONS = ["a", "bb", "ccc", "dddd"]


@pytest.fixture
def worker():
    w = RewardWorker(heartbeat_s=0.1, silent_after_s=1.5)
    yield w
    w.close(kill=True)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a killed child not yet reaped is a zombie: gone for our purpose
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_stopped_idle_worker_is_replaced_and_the_call_answered(worker):
    assert worker.call("helpers:varied", {"completions": COMPLETIONS}, 30) == varied(COMPLETIONS)
    stopped = worker.pid
    os.kill(stopped, signal.SIGSTOP)
    t0 = time.monotonic()
    assert worker.call("helpers:varied", {"completions": COMPLETIONS}, 30) == varied(COMPLETIONS)
    assert worker.replaced == 1 and worker.pid != stopped and _gone(stopped)
    assert time.monotonic() - t0 >= 1.5  # it waited out silent_after_s, not the 30 s timeout
    print(f"answered {time.monotonic() - t0:.2f} s after the stop")


def test_a_worker_stopped_mid_call_is_replaced_and_the_call_made_again(worker, monkeypatch):
    monkeypatch.setenv("HINDSIGHT_TEST_SLOW_S", "1.0")
    worker.call("helpers:varied", {"completions": COMPLETIONS}, 30)  # the worker starts with this env
    pid = worker.pid
    threading.Timer(0.3, os.kill, args=(pid, signal.SIGSTOP)).start()  # inside the 1 s reward
    assert worker.call("helpers:slow", {"completions": COMPLETIONS}, 30) == varied(COMPLETIONS)
    assert worker.replaced == 1 and _gone(pid)


def test_a_slow_reward_keeps_its_worker_and_meets_its_timeout(worker, monkeypatch):
    monkeypatch.setenv("HINDSIGHT_TEST_SLOW_S", "3.0")  # twice silent_after_s, beating all along
    assert worker.call("helpers:slow", {"completions": COMPLETIONS}, 30) == varied(COMPLETIONS)
    assert worker.replaced == 0
    with pytest.raises(RewardTimeout, match=r"helpers:slow ran past its 2s timeout"):
        worker.call("helpers:slow", {"completions": COMPLETIONS}, 2)
    assert worker.replaced == 0  # a timeout kills the worker, but it was never silent


def test_a_worker_silent_on_every_try_is_a_timeout(worker):
    with pytest.raises(RewardTimeout, match=r"helpers:stops_itself: its worker fell silent twice "
                                            r"\(rl.workers.silent_after_s 1.5\)"):
        worker.call("helpers:stops_itself", {"completions": COMPLETIONS}, 30)
    assert worker.replaced == 2
