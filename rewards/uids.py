"""The uid a sandbox runs as when hindsight runs as root: one no other live sandbox on this host
holds.

A counter per process gave every process the same first uid, so the sandboxes of two processes
(two reward workers of one run, two runs on one host) ran as one user: one process limit
(RLIMIT_NPROC counts a uid's processes) between them, and a program in one could signal the
programs of the other. A claim is an exclusive `flock` on a file named by the uid, held until
the sandbox closes. The kernel drops it when its holder dies, so a killed run frees its uids.
"""
from __future__ import annotations

import fcntl
import itertools
import os
import tempfile
from pathlib import Path

# where a process starts looking: pids differ, so two processes rarely probe the same uids
_START = itertools.count(os.getpid() * 37)


def claims_folder() -> Path:
    """Root's own folder of claim files (0700): a folder another user made could be theirs to fill."""
    # one place for every process on the host: a TMPDIR of its own (set per job) would hide its claims
    tmp = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
    folder = tmp / f"hindsight-sandbox-uids-{os.geteuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    if folder.stat().st_uid != os.geteuid():
        raise PermissionError(f"{folder}: owned by uid {folder.stat().st_uid}, not by this user")
    return folder


class UidClaim:
    """A uid in [base, base + span) held by this process until `release`."""

    def __init__(self, base: int, span: int = 4096, folder: Path | None = None):
        folder = folder or claims_folder()
        start = next(_START)
        for i in range(span):
            uid = base + (start + i) % span
            fd = _try_lock(folder, uid)
            if fd >= 0:
                self.uid, self._fd = uid, fd
                return
        raise RuntimeError(f"every sandbox uid from {base} to {base + span - 1} is held by a live sandbox ({folder})")

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the file drops the lock
            self._fd = -1


def is_claimed(uid: int, folder: Path | None = None) -> bool:
    """Whether a live process holds `uid` now (the probe's own lock is dropped at once)."""
    fd = _try_lock(folder or claims_folder(), uid)
    if fd < 0:
        return True
    os.close(fd)
    return False


def _try_lock(folder: Path, uid: int) -> int:
    """The uid's claim file, open and exclusively locked; -1 when another holder has it."""
    fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return -1
    return fd
