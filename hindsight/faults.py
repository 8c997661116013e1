"""Fault injection for the crash tests: `HINDSIGHT_FAULT=point:step` SIGKILLs this process
when execution reaches that point at that step. Unset (always, outside tests) it does nothing."""
from __future__ import annotations

import os
import signal


def crash_point(point: str, step: int) -> None:
    spec = os.environ.get("HINDSIGHT_FAULT")
    if spec and spec == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
