"""One memory limit for a sandboxed program's whole process tree: a memory cgroup.

An address-space rlimit is per process, so a program that forks N times holds N times it. A
cgroup's limit holds for every process in it, and a fork stays in its parent's cgroup, so the
sandbox starts in a fresh one (its launcher enters it, then execs bubblewrap: every process of
the run is born in it): together they cannot hold more than `memory_mb`, files written to the
sandbox's tmpfs included (tmpfs pages are charged to the cgroup that wrote them). Past
it the kernel's OOM killer ends a process of the group, and the completion scores 0.

The sandbox's group is made inside the job's own memory cgroup, so what the sandbox holds also
counts against the job's own limit (a Kubernetes pod's, a container's): under cgroup v1 in the
job's own folder of the memory hierarchy (`/sys/fs/cgroup/memory/<the job's>`, writable by
root, as in a container); under v2 in the job's own folder when the memory controller is
delegated there, else beside it (v2 lets no folder that holds processes have children with
controllers: the job would have to move itself into a leaf). With neither, `problem()` says
why, and the code reward refuses to run unless its config opts out (`memory_scope: process`).
"""
from __future__ import annotations

import atexit
import itertools
import os
import re
import signal
import time
from functools import lru_cache
from pathlib import Path

_V1 = Path("/sys/fs/cgroup/memory")
_NAMES = itertools.count()
_PREFIX = "hindsight-sandbox-"
_LIVE: set["MemoryGroup"] = set()  # this process's open groups, closed at its exit whatever ended it cleanly


@lru_cache(maxsize=1)
def _base() -> tuple[str, Path] | None:
    """("v2" or "v1", the folder new groups go in: the job's own memory cgroup where it can be), or None."""
    own = _own_v2_path()
    for folder in ([own, own.parent] if own else []):  # inside the job's own first
        controls = folder / "cgroup.subtree_control"
        try:
            if "memory" in controls.read_text().split() and os.access(folder, os.W_OK):
                return "v2", folder
        except OSError:
            continue
    for folder in (_own_v1_path(), _V1):
        if folder is not None and (folder / "memory.limit_in_bytes").exists() and os.access(folder, os.W_OK):
            return "v1", folder
    return None


def _own_v1_path() -> Path | None:
    """The job's own folder in the v1 memory hierarchy (`N:memory:/its/path` in /proc/self/cgroup)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                return _V1 / path.lstrip("/")
    except (OSError, ValueError):
        pass
    return None


def _own_v2_path() -> Path | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                root = Path("/sys/fs/cgroup")
                return root / line[3:].lstrip("/") if (root / "cgroup.controllers").exists() else None
    except OSError:
        pass
    return None


def problem() -> str | None:
    """Why no memory cgroup can be made here, or None."""
    if _base() is None:
        return ("no memory cgroup can be made here (neither a cgroup v2 folder with the memory controller this "
                "process may write, nor a writable v1 /sys/fs/cgroup/memory), so one memory limit cannot hold for "
                "the program's whole process tree")
    return None


class MemoryGroup:
    """A fresh memory cgroup with `limit_bytes` for everything moved into it (and their forks)."""

    def __init__(self, limit_bytes: int):
        kind, base = _base() or (None, None)
        if kind is None:
            raise RuntimeError(problem())
        self.kind = kind
        sweep_orphans(base)
        _hook_sigterm()
        self.path = base / f"{_PREFIX}{os.getpid()}-{next(_NAMES)}"
        self.path.mkdir()
        _LIVE.add(self)
        if kind == "v2":
            (self.path / "memory.max").write_text(str(limit_bytes))
            if (self.path / "memory.swap.max").exists():
                (self.path / "memory.swap.max").write_text("0")
        else:
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            swap = self.path / "memory.memsw.limit_in_bytes"
            if swap.exists():  # with swap accounting, swap counts too
                swap.write_text(str(limit_bytes))

    @property
    def procs(self) -> str:
        """The file a process writes its pid to, to enter the group (`sandbox._ENTER` does)."""
        return str(self.path / "cgroup.procs")

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the group for its memory."""
        try:
            if self.kind == "v2":
                events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
                return int(events.get("oom_kill", 0)) > 0
            control = dict(line.split() for line in (self.path / "memory.oom_control").read_text().splitlines())
            return int(control.get("oom_kill", 0)) > 0
        except (OSError, ValueError):
            return False

    def close(self) -> None:
        """Kill whatever is left in the group, then remove it."""
        for _ in range(50):
            pids = self._pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.02)
        try:
            self.path.rmdir()
        except OSError:
            pass  # a process still leaving: the group is swept by the next sandbox once its owner is gone
        _LIVE.discard(self)

    def _pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []


def sweep_orphans(base: Path) -> list[Path]:
    """Remove the groups a sandbox's process left when it was killed (SIGTERM or SIGKILL leave no
    chance to): those named for a process that no longer runs, once their own processes are
    killed. A live process's groups are its own to close."""
    removed = []
    try:
        names = [p for p in base.iterdir() if p.is_dir() and p.name.startswith(_PREFIX)]
    except OSError:
        return removed
    for folder in names:
        m = re.fullmatch(rf"{_PREFIX}(\d+)-\d+", folder.name)
        if not m or _alive(int(m.group(1))):
            continue
        group = MemoryGroup.__new__(MemoryGroup)
        group.path = folder
        group.close()
        if not folder.exists():
            removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@atexit.register
def _close_live() -> None:
    for group in list(_LIVE):
        group.close()


_HOOKED = {"pid": None}


def _hook_sigterm() -> None:
    """Where SIGTERM would end the process (no handler of its own), close its open groups first
    and then die by the signal as before. A handler that was there (the RL stage's preemption
    guard, which finishes the step in flight) is left to do its work: closing the groups would
    kill the step's sandboxed calls. Set once a process, from its main thread."""
    import threading

    if _HOOKED["pid"] == os.getpid() or threading.current_thread() is not threading.main_thread():
        return
    before = signal.getsignal(signal.SIGTERM)

    def closing(signum, frame):
        if callable(before):
            before(signum, frame)
        elif before != signal.SIG_IGN:
            _close_live()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, closing)
    _HOOKED["pid"] = os.getpid()
