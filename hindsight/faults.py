"""Fault injection for the crash and retry tests. Unset (always, outside tests) it does nothing.

`HINDSIGHT_FAULT` holds one spec:
    point:step            SIGKILL this process when execution reaches `point` at `step`
    raise:point:step      raise a transient RuntimeError there, once per process (a retry passes)
    fail:point:step       raise a RuntimeError there every time (retries cannot help)
    kill_once:point:step:MARKER   SIGKILL there unless the file MARKER exists, creating it first:
                          a restarted worker reaching the same point carries on
    pause:point:step:MARKER   unless the file MARKER exists, write this process's pid into it and
                          sleep there for an hour: a worker alive but stuck, until the test
                          removes it (its Ray node, say) or a lease deadline passes
    disk_full:SUBSTRING   every atomic write whose path contains SUBSTRING fails with ENOSPC
                          after writing half its bytes, as a full disk would
    disk_full_while:FILE  every atomic write fails so while the file FILE exists: a disk full for
                          as long as a test or the chaos soak keeps FILE
"""
from __future__ import annotations

import errno
import os
import signal
import time

_raised: set[str] = set()


def crash_point(point: str, step: int) -> None:
    spec = os.environ.get("HINDSIGHT_FAULT")
    if not spec:
        return
    if spec == f"{point}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)
    if spec == f"raise:{point}:{step}" and spec not in _raised:
        _raised.add(spec)
        raise RuntimeError(f"injected transient fault at {point} step {step}")
    if spec.startswith(f"kill_once:{point}:{step}:"):
        marker = spec.split(":", 3)[3]
        if not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
    if spec.startswith(f"pause:{point}:{step}:"):
        marker = spec.split(":", 3)[3]
        if not os.path.exists(marker):
            with open(f"{marker}.tmp", "w") as f:  # whole before it is seen: the test reads the pid
                f.write(str(os.getpid()))
            os.replace(f"{marker}.tmp", marker)
            time.sleep(3600)
    if spec == f"fail:{point}:{step}":
        raise RuntimeError(f"injected permanent fault at {point} step {step}")


def disk_full(path) -> bool:
    spec = os.environ.get("HINDSIGHT_FAULT", "")
    if spec.startswith("disk_full_while:"):
        return os.path.exists(spec.removeprefix("disk_full_while:"))
    return spec.startswith("disk_full:") and spec.removeprefix("disk_full:") in str(path)


def enospc(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
