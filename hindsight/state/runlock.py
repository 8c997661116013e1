"""One run at a time per run directory: an exclusive lock that names its holder.

`run_dir/.hindsight.lock` is held with flock(2) for as long as a command (or a deployed
flow) works on the directory; it holds the holder's host, pid and start time. A second run
fails at once naming the holder. The kernel drops the flock when its holder dies, however
it dies, so a lock left by a dead process is simply taken over (and that is logged). The
file is removed on release: a run that ends leaves nothing behind.

Re-entrant within a process: the pipeline's stages take it again under the command's hold.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from hindsight.errors import HindsightError
from hindsight.state.rundir import RunDir

log = logging.getLogger("hindsight.lock")
LOCK_NAME = ".hindsight.lock"
_held: dict[str, list[int]] = {}  # lock path -> [fd, depth]
_guard = threading.Lock()


class RunLocked(HindsightError):
    """Another run holds the run directory."""


def _describe(info: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on {info.get('host')}, started {started}"


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        info = json.loads(os.read(fd, 4096) or b"{}")
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _acquire(path: Path) -> int:
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            raise RunLocked(f"{path.parent}: in use by another hindsight run ({_describe(holder)}); wait for it to "
                            f"finish, or give this run another run_dir") from None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:  # else its holder released and removed it between our open and our flock
            return fd
        os.close(fd)


@contextmanager
def run_lock(run_dir: str | Path):
    path = Path(run_dir).resolve() / LOCK_NAME
    key = str(path)
    with _guard:
        if key in _held:
            _held[key][1] += 1
        else:
            RunDir(path.parent).claim()  # hindsight's folder, or refused before anything is written
            fd = _acquire(path)
            stale = _read(fd)
            if stale:
                log.warning("run dir %s: taking over the lock of %s, which is no longer running", path.parent,
                            _describe(stale))
            me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
            _held[key] = [fd, 1]
    try:
        yield path
    finally:
        with _guard:
            _held[key][1] -= 1
            if _held[key][1] == 0:
                fd = _held.pop(key)[0]
                path.unlink(missing_ok=True)  # while still holding it: a waiter re-checks the inode
                os.close(fd)
