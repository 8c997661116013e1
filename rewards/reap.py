"""Ending a sandbox's run for good: its processes killed and reaped, its namespace init gone
(`rewards/sandbox.py` calls `end_run` when a run closes, whatever its state)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path


def init_pid(info: bytes) -> int | None:
    """The sandbox init's pid, from the info bwrap writes (`--info-fd`); None if it wrote none."""
    try:
        return int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def end_run(proc: subprocess.Popen, init: int | None, ended: bool) -> None:
    """End the run (`init`: the sandbox init's pid, when bwrap reported it). Under bwrap,
    SIGKILL to that init ends its PID namespace, every process in it with it, and bwrap reaps
    it; killing bwrap first would leave the init to the host's pid 1 (a zombie, in a container
    whose init does not reap)."""
    if ended:
        try:
            proc.wait(timeout=2)  # everything closed its pipes: bwrap is about to exit by itself
            await_exit(init)
            return
        except subprocess.TimeoutExpired:
            pass
    if init is not None:
        try:
            os.kill(init, signal.SIGKILL)
            proc.wait(timeout=5)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # unsafe-local: the session; under bwrap, a last resort
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    await_exit(init)


def await_exit(pid: int | None, grace_s: float = 1.0) -> None:
    """bwrap can exit while its namespace init is still tearing down (a full tmpfs takes a
    moment): return only once that init is gone, killing it after a grace period."""
    if pid is None:
        return
    deadline, killed = time.monotonic() + grace_s, False
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return
        if state == "Z":
            return
        if time.monotonic() > deadline:
            if killed:
                return  # stuck in the kernel; it holds no pipe of ours, and the kill is queued
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                return
            deadline, killed = time.monotonic() + 5 * grace_s, True
        time.sleep(0.005)
