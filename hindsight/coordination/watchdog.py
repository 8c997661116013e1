"""The step watchdog: a phase of a step (rollout, score, update) that makes no progress for
`rl.workers.stall_factor` times the median of that role's earlier phases fails, instead of
wedging the run (NeMo-RL #3488: a trainer waited 3.7 hours on an empty buffer).

Before it fails the phase, the watchdog writes a stall report into `rl/stalls/`: the role that
stalled, how long it ran against its limit, every thread's Python stack in this process, and the
stacks of the role processes that can answer (they dump them on SIGUSR1). Then it raises
`RoleStalled` in the thread running the phase: by a signal when that is the main thread (a
signal interrupts a blocking call such as a sleep), else as an asynchronous exception, which
lands at the thread's next Python instruction. A phase still running `grace_s` later (stuck in
C code) ends the process, as a SIGKILL would: every stage resumes from its newest checkpoint.
"""
from __future__ import annotations

import ctypes
import os
import signal
import statistics
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from hindsight.coordination.liveness import RoleStalled, stall_report


class Watchdog:
    def __init__(self, stalls: Path, workers, children=lambda: []):
        """`children()`: (role, pid, log path) of the processes whose stacks a report asks for."""
        self.stalls, self.children = stalls, children
        self.factor, self.min_s, self.first_s = workers.stall_factor, workers.stall_min_s, workers.stall_first_s
        self.grace_s = workers.silent_after_s
        self.took: dict[str, list[float]] = {}
        self._lock, self._wake = threading.Lock(), threading.Event()
        self._armed: tuple | None = None  # (role, step, started, limit, thread ident)
        self._since = 0.0  # the armed phase's last progress (its start, or a progress() since)
        self._handler = None
        self._fired: RoleStalled | None = None
        self._closed = False
        self._handler = _install(self)
        self._thread = threading.Thread(target=self._watch, daemon=True, name="hindsight-watchdog")
        self._thread.start()

    def limit_s(self, role: str) -> float:
        """How long a phase of `role` may run: stall_factor x the median of its past phases (at
        least stall_min_s), or stall_first_s before any has finished."""
        past = self.took.get(role)
        return max(self.min_s, self.factor * statistics.median(past)) if past else self.first_s

    @contextmanager
    def phase(self, role: str, step: int):
        """Around one phase of a step: raises `RoleStalled` if it overruns its limit."""
        started = time.monotonic()
        with self._lock:
            self._armed, self._fired = (role, step, started, self.limit_s(role), threading.get_ident()), None
            self._since = started
        self._wake.set()
        try:
            yield
        except BaseException:
            if self._fired is not None:  # the phase ended with what our interruption caused
                raise self._fired from None
            raise
        finally:
            with self._lock:
                self._armed = None
        self.took[role] = (self.took.get(role, []) + [time.monotonic() - started])[-20:]

    def progress(self) -> None:
        """The phase in hand moved on, though it has not ended (a role replaced, a stored step
        trained again): its limit counts from now."""
        with self._lock:
            if self._armed is not None:
                self._since = time.monotonic()
        self._wake.set()

    def _watch(self) -> None:
        while not self._closed:
            with self._lock:
                armed, since = self._armed, self._since
            if armed is None:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            role, step, started, limit, ident = armed
            left = since + limit - time.monotonic()
            if left > 0:
                self._wake.wait(min(left, 1.0))
                self._wake.clear()
                continue
            self._fire(role, step, started, limit, ident)
            deadline = time.monotonic() + self.grace_s
            while self._armed is not None and self._armed[2] == started and time.monotonic() < deadline:
                time.sleep(0.2)
            if self._armed is not None and self._armed[2] == started:  # stuck in C code: end the process
                sys.stderr.write(f"error: {self._fired}; the phase did not stop within {self.grace_s:g} s, so the "
                                 f"process ends: rerun the same command to resume from the newest checkpoint\n")
                sys.stderr.flush()
                os._exit(70)

    def _fire(self, role: str, step: int, started: float, limit: float, ident: int) -> None:
        why = (f"no progress for {limit:.3g} s (rl.workers.stall_factor {self.factor:g} x the median of its earlier "
               f"phases, at least stall_min_s {self.min_s:g}; stall_first_s {self.first_s:g} before any)")
        report = stall_report(self.stalls, role, step, why, self._children_stacks())
        with self._lock:
            if self._armed is None or self._armed[1:3] != (step, started):
                return  # it finished while the report was written
            self._fired = RoleStalled(f"step {step}: the {role} phase", why, report)
            if ident == threading.main_thread().ident and self._handler is not None:
                signal.pthread_kill(ident, signal.SIGUSR2)  # wakes a blocking call (a sleep); the handler raises
            else:  # lands at the thread's next Python instruction
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_Interrupted))

    def _children_stacks(self) -> str:
        """Ask each role process for its stacks (SIGUSR1), then read what it wrote to its log."""
        asked = []
        for role, pid, log in self.children():
            try:
                size = log.stat().st_size if log.exists() else 0
                os.kill(pid, signal.SIGUSR1)
                asked.append((role, pid, log, size))
            except OSError:
                continue
        if asked:
            time.sleep(1.0)
        out = []
        for role, pid, log, size in asked:
            with open(log, "rb") as fh:
                fh.seek(size)
                out.append(f"{role} (pid {pid}):\n{fh.read().decode('utf-8', 'replace').strip() or '(no answer)'}")
        return "\n\n".join(out)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._handler is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR2, self._handler)
            self._handler = None


class _Interrupted(BaseException):
    """What lands in a phase the watchdog stops (a BaseException: a reward's or a tool's `except
    Exception` must not swallow it); the phase re-raises it as the `RoleStalled` it stands for."""


def _install(watchdog: "Watchdog"):
    """SIGUSR2 raises `_Interrupted` in the main thread while one of its phases has been fired on
    (else it is ignored, never the default action, which would end the process); returns the
    handler it replaced, or None where this is not the main thread (the asynchronous exception alone
    then stops the phase)."""
    def handler(signum, frame):
        armed = watchdog._armed
        if armed is not None and watchdog._fired is not None and armed[4] == threading.main_thread().ident:
            raise _Interrupted()

    try:
        return signal.signal(signal.SIGUSR2, handler)
    except ValueError:  # not the main thread
        return None
