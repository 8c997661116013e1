"""The step watchdog (issue 47): a phase that overruns stall_factor x the median of its role's
earlier phases fails with RoleStalled, after a stall report naming the role, with the stacks."""
import threading
import time
from types import SimpleNamespace

import pytest

from hindsight.coordination.liveness import Liveness, RoleStalled, work_deadline_s
from hindsight.coordination.watchdog import Watchdog


def _workers(**kw):
    return SimpleNamespace(**{"stall_factor": 10.0, "stall_min_s": 0.5, "stall_first_s": 0.5, "silent_after_s": 5.0,
                              **kw})


def test_the_limit_is_a_multiple_of_the_median_with_a_floor(tmp_path):
    dog = Watchdog(tmp_path, _workers(stall_min_s=2.0, stall_first_s=99.0))
    try:
        assert dog.limit_s("update") == 99.0  # nothing finished yet
        dog.took["update"] = [1.0, 3.0, 2.0]
        assert dog.limit_s("update") == 20.0  # 10 x the median 2
        dog.took["score"] = [0.01, 0.02]
        assert dog.limit_s("score") == 2.0  # never under stall_min_s
    finally:
        dog.close()


def _stuck_in_sleep():
    time.sleep(60)


def test_a_phase_stuck_on_the_main_thread_is_interrupted_with_a_report(tmp_path):
    dog = Watchdog(tmp_path / "stalls", _workers())
    try:
        with dog.phase("score", 2):
            pass  # a quick phase: recorded, not fired on
        assert len(dog.took["score"]) == 1
        with pytest.raises(RoleStalled, match=r"step 3: the score phase: no progress for 0.5 s") as caught:
            with dog.phase("score", 3):
                _stuck_in_sleep()  # a blocking call: the signal wakes it
        report = caught.value.report.read_text()
        assert report.startswith("score stalled at step 3") and "_stuck_in_sleep" in report
        assert len(dog.took["score"]) == 1  # a stalled phase is not a measure of how long the role takes
        with dog.phase("score", 4):
            pass  # the next phase runs normally
    finally:
        dog.close()


def test_a_phase_spinning_on_another_thread_is_interrupted(tmp_path):
    dog = Watchdog(tmp_path / "stalls", _workers())
    caught = []

    def spin():
        try:
            with dog.phase("rollout", 0):
                while True:
                    sum(range(100))
        except RoleStalled as exc:
            caught.append(exc)

    try:
        worker = threading.Thread(target=spin)
        worker.start()
        worker.join(30)
        assert not worker.is_alive() and caught and caught[0].role == "step 0: the rollout phase"
    finally:
        dog.close()


def test_progress_restarts_the_phase_clock(tmp_path):
    """A phase that replaces a role (or trains a stored step again) says so; it is not stalled
    while it keeps moving, though its whole length passes the limit several times."""
    dog = Watchdog(tmp_path / "stalls", _workers(stall_min_s=0.5, stall_first_s=0.5))
    try:
        t0 = time.monotonic()
        with dog.phase("update", 1):
            for _ in range(8):  # 2 s in all, against a limit of 0.5 s
                time.sleep(0.25)
                dog.progress()
        assert time.monotonic() - t0 >= 2.0
        assert not (tmp_path / "stalls").exists()  # no report: it never stalled
        with pytest.raises(RoleStalled, match=r"step 2: the score phase"):
            with dog.phase("score", 2):
                _stuck_in_sleep()  # and without progress a phase still fires
    finally:
        dog.close()


def test_liveness_tells_silent_from_alive_and_stuck():
    workers = SimpleNamespace(lease_ttl_s=10.0, lease_s_per_token=0.5)
    life = Liveness(silent_after_s=5.0, deadline_s=work_deadline_s(workers, 20), start_s=60.0, beat_at=0.0,
                    progress_at=0.0)
    assert life.deadline_s == 20.0  # 10 + 0.5 x 20 tokens: a longer group gets a longer lease
    assert life.verdict(now=50.0) is None  # still starting (loading its model)
    assert "not started within 60 s" in life.verdict(now=61.0)
    life.heard(progress=0, now=61.0)
    assert life.verdict(now=65.0) is None
    assert "no heartbeat for 6 s" in life.verdict(now=67.0)  # stopped: nothing heard
    for t in range(62, 90):
        life.heard(progress=0, now=float(t))  # beats, but the count never moves
    assert "alive but nothing written for 28 s" in life.verdict(now=89.0)
    life.heard(progress=1, now=89.5)
    assert life.verdict(now=90.0) is None


def test_loading_a_model_is_start_up_and_the_deadline_starts_when_it_is_built():
    workers = SimpleNamespace(lease_ttl_s=6.0, lease_s_per_token=0.0)
    life = Liveness(silent_after_s=4.0, deadline_s=work_deadline_s(workers, 20), start_s=60.0, beat_at=0.0,
                    progress_at=0.0)
    life.working(now=1.0)  # a step handed over while the replacement still loads its model
    for t in range(2, 40):
        life.heard(now=float(t), loading=True)
    assert life.verdict(now=40.0) is None  # 39 s past the hand-over, but loading is not hung
    life.heard(progress=0, now=40.0)  # built: the work in hand's 6 s start now
    life.heard(progress=0, now=43.0)
    assert life.verdict(now=45.0) is None
    life.heard(progress=0, now=46.5)
    assert "alive but nothing written for 7 s" in life.verdict(now=47.0)
    slow = Liveness(silent_after_s=4.0, deadline_s=6.0, start_s=60.0, beat_at=0.0, progress_at=0.0)
    for t in range(1, 64):
        slow.heard(now=float(t), loading=True)
    assert "its model not built within 60 s" in slow.verdict(now=63.5)  # loading has its own limit
