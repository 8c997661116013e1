"""Atomic file writes: write to a temporary name in the same folder, fsync, then rename.

A rename within one filesystem is atomic, so a reader (or a resume after SIGKILL) sees
either the old complete file or the new complete one, never a torn write. A write that
fails removes its temporary file and raises `StorageError` naming the path.

A full disk is often short (logs rotated, an old checkpoint pruned, a neighbour's scratch
deleted): a write that meets one waits for space, retrying with backoff, for up to
$HINDSIGHT_NO_SPACE_WAIT_S seconds (60 by default; 0 fails at once) before it fails, so a long
run is not lost to a minute of it. The roles' heartbeats go on meanwhile, from their own threads.
"""
from __future__ import annotations

import hashlib

import errno
import json
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path

from hindsight.errors import StorageError
from hindsight.faults import disk_full, enospc

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
log = logging.getLogger(__name__)


def no_space_wait_s() -> float:
    return float(os.environ.get("HINDSIGHT_NO_SPACE_WAIT_S", "60"))


def _waiting_for_space(write, path: Path):
    """`write()`, retried while the disk is full, up to `no_space_wait_s()`; other errors, and a
    disk still full after the wait, raise `StorageError` naming `path`."""
    waited, pause, limit = 0.0, 0.25, no_space_wait_s()
    while True:
        try:
            return write()
        except OSError as exc:
            if exc.errno not in _NO_SPACE or waited >= limit:
                raise _storage_error(path, exc, waited) from exc
            if waited == 0.0:
                log.warning("%s: disk full; waiting up to %g s for space (HINDSIGHT_NO_SPACE_WAIT_S)", path, limit)
        time.sleep(min(pause, limit - waited))
        waited, pause = waited + min(pause, limit - waited), min(pause * 2, 5.0)


# what the atomic writes below name their temporaries: `.NAME.tmp-PID-THREAD` (older ones:
# `.NAME.tmp-PID`). The thread is in the name because two threads of one process may write one
# file at once (the spool's first op from two tracking threads): with one shared temporary, one
# thread's rename takes the other's file away mid-write.
TEMPORARY = re.compile(r"^\..+\.tmp-(\d+)(?:-\d+)?$")


def temporary_for(path: Path) -> Path:
    """The temporary an atomic write of `path` fills, this process's and this thread's own."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


def remove_dead_temporaries(folder: Path) -> None:
    """Remove the temporary files in `folder` of writers that died before their rename (a SIGKILL
    mid-write); a live writer's (its pid still running) are left to it. For a folder that writers
    share while the run goes on; at a stage's start `RunDir.sweep_temporaries` clears them all."""
    for tmp in Path(folder).iterdir():
        m = TEMPORARY.match(tmp.name)
        if m and tmp.is_file() and not _alive(int(m.group(1))):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _make_parent(path: Path) -> None:
    """The file's folder, made if missing: a stat when it exists (these writes run every step),
    not mkdir's failed create."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data), partial=lambda fh: fh.write(data[: len(data) // 2]))


def atomic_write(path: Path, fill, partial=None) -> None:
    """`path` written whole or not at all: `fill(fh)` writes into a temporary beside it, which is
    synced and renamed over `path`. Streaming into the file (a `torch.save` of an optimizer's state)
    holds no second copy of the content in memory, as building the bytes first would. `partial`:
    what the disk-full fault writes before it fails (default: nothing)."""
    path = Path(path)
    tmp = temporary_for(path)

    def write() -> None:
        try:
            _make_parent(path)
            with open(tmp, "wb") as fh:
                if disk_full(path):
                    if partial is not None:
                        partial(fh)
                    raise enospc(tmp)
                fill(fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            if tmp.exists():
                tmp.unlink()
    _waiting_for_space(write, path)


def _storage_error(path: Path, exc: OSError, waited: float = 0.0) -> StorageError:
    why = f"disk full, still after {waited:g} s" if exc.errno in _NO_SPACE else f"{exc.strerror or exc}"
    return StorageError(f"{path}: write failed ({why}); the partial file was removed and the newest "
                        f"complete state is kept: fix the cause and rerun the same command to resume")


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=2, sort_keys=True).encode("utf-8"))


def atomic_dir(final: Path, fill) -> Path:
    """Build a folder under a temporary name with `fill(tmp_path)`, then rename it into place."""
    final = Path(final)
    tmp = temporary_for(final)

    def write() -> None:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir(parents=True)
            fill(tmp)
            if disk_full(final):
                raise enospc(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _waiting_for_space(write, final)
    return final


def read_json(path: Path, default=None):
    path = Path(path)
    if not path.exists():
        return default
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StorageError(f"{path}: corrupt JSON ({exc}); restore it or move the run directory aside") from None



def append_line(path: Path, line: str) -> None:
    """Append one line to a log (metrics, alerts). A crash can tear only the last line, which readers skip."""
    path = Path(path)

    def write() -> None:
        _make_parent(path)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line.rstrip("\n") + "\n")
    _waiting_for_space(write, path)


def append_record(path: Path, obj) -> None:
    """Append `obj` as one compact JSON line to a journal, in one write. The line starts with a
    newline, so a record after a torn one (a crash mid-append) still stands on a line of its own."""
    path = Path(path)
    data = ("\n" + json.dumps(obj, sort_keys=True, separators=(",", ":"))).encode("utf-8")

    def write() -> None:  # a retry after a torn write starts a line of its own: readers skip the torn one
        if disk_full(path):
            raise enospc(path)
        _make_parent(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    _waiting_for_space(write, path)


def file_sha256(path: str | Path) -> str | None:
    """The hex sha256 of a file, read in 1 MiB blocks (a checkpoint or dataset may be large);
    None when it is not a file."""
    p = Path(path)
    if not p.is_file():
        return None
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
