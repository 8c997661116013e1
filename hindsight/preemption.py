"""Preemption: a reclaimed cloud or Kubernetes node sends SIGTERM and waits a grace period.

From the RL stage's first model load, the first SIGTERM (or SIGINT) only asks for a stop: the
step in flight finishes, a complete checkpoint of it is written (or, before the first step,
nothing is trained), and the stage ends with `Preempted` (exit 128 + the signal) saying how to
resume. A second signal exits at once (status 128 + signal); the newest complete
checkpoint still stands, as every checkpoint is committed atomically. Handlers can only be set
in the main thread: elsewhere the guard does nothing and the default behaviour stays.
"""
from __future__ import annotations

import os
import signal
import threading

from hindsight.console import say

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preemption:
    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.received is not None

    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def _handle(self, signum, frame) -> None:
        if self.received is not None:  # the second one: now
            os._exit(128 + signum)
        self.received = signum
        say(f"{signal.Signals(signum).name}: finishing the step in flight, then writing its checkpoint "
            f"(send it again to exit at once)")

    def __enter__(self) -> "Preemption":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
