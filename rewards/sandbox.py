"""Run untrusted (model-written) Python under bubblewrap, with limits.

`mode="bwrap"` (the default) isolates what the program can reach:
- the filesystem: a new mount namespace whose root holds only `/usr` (and the interpreter's
  prefix), read-only, a fresh `/proc`, a read-only `/dev`, and a private tmpfs of `tmp_mb` at
  `/tmp`, the only writable place (the root itself is remounted read-only); no `/etc`, no
  home, no project source;
- processes: a new PID namespace. When the program's main process exits, or the run times
  out, bubblewrap's init dies and the kernel kills everything left in the namespace;
- the user: when hindsight runs as root, the sandbox runs as an unprivileged uid *outside*
  the namespace too, one no other live sandbox on the host holds (`rewards/uids.py`), so
  root's files are not its files and one sandbox cannot signal another's programs;
- the network: a new network namespace with no interface (no loopback server, no TCP,
  unix sockets only on the private tmpfs), and no IPC or UTS shared with the host;
- resources: rlimits on CPU seconds, address space, processes, file size and open files
  (set by the harness before the program runs), one memory limit for the whole process tree
  (`memory_scope: tree`, a memory cgroup, `rewards/cgroup.py`: forks and tmpfs files count
  too; without one the sandbox refuses unless `memory_scope: process` is set), a wall-clock
  timeout, and an output cap: past `output_bytes` the run is killed, so a flood costs the
  parent nothing.

`mode="unsafe-local"` runs the same harness in a plain subprocess (rlimits, a temporary
directory, an empty environment, a new session), with none of the isolation above. It is
for trusted code on machines without user namespaces, and only when a config says so.
"""
from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rewards import cgroup
from rewards.reap import end_run, init_pid
from rewards.uids import UidClaim

MODES = ("bwrap", "unsafe-local")
_HARNESS = (Path(__file__).with_name("harness.py")).read_text(encoding="utf-8")
# Enters the memory cgroup before anything of the sandbox exists (every later process is born in
# it: no race with a fork), then drops to the sandbox's uid and execs bwrap (or the harness).
_ENTER = ("import os, sys\n"
          "with open(sys.argv[1], 'w') as f:\n    f.write(str(os.getpid()))\n"
          "uid = int(sys.argv[2])\n"
          "if uid >= 0:\n    os.setgroups([]); os.setgid(uid); os.setuid(uid)\n"
          "os.execvp(sys.argv[3], sys.argv[3:])\n")


class SandboxUnavailable(RuntimeError):
    """The isolation asked for cannot be set up on this machine."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0        # wall clock, per program
    cpu_s: int = 5                 # per process
    memory_mb: int = 512           # address space, per process
    processes: int = 32            # per sandbox
    file_mb: int = 16              # largest file it may write
    tmp_mb: int = 64               # its writable tmpfs
    open_files: int = 64
    output_bytes: int = 1 << 20    # stdout + stderr kept; more kills the program
    uid_base: int = 61000          # when run as root: the sandbox's uids outside the namespace
    memory_scope: str = "tree"     # tree: memory_mb for all its processes (a cgroup); process: per process only

    def rlimits(self) -> dict[str, int]:
        return {"cpu_s": self.cpu_s, "memory_bytes": self.memory_mb << 20, "processes": self.processes,
                "file_bytes": self.file_mb << 20, "open_files": self.open_files}


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    output_truncated: bool
    mode: str
    answers: list[dict]            # the harness's first JSON lines, in order (unparseable ones dropped)
    memory_killed: bool = False    # the kernel killed a process of the tree at the memory limit

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and not self.output_truncated


def _interpreter() -> tuple[str, str | None]:
    """(python inside the sandbox, a prefix to bind read-only or None when under /usr)."""
    real = os.path.realpath(sys.executable)
    if real.startswith("/usr/"):
        return real, None
    prefix = os.path.realpath(sys.base_prefix)
    if os.geteuid() != 0 or _world_traversable(prefix):
        return real, prefix
    # root's own interpreter (pyenv under /root) is unreadable by the sandbox's uid
    for candidate in (f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}", "/usr/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate, None
    raise SandboxUnavailable(f"the sandbox's uid cannot read {prefix} and there is no /usr/bin/python3")


def _world_traversable(path: str) -> bool:
    p = Path(path)
    return all(os.stat(d).st_mode & stat.S_IXOTH for d in [p, *p.parents])


def _bwrap_argv(python: str, prefix: str | None, limits: Limits, role: str, channel: int, requests: int,
                info: int) -> list[str]:
    argv = ["bwrap", "--info-fd", str(info), "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOME", "/tmp", "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{link}"):
            argv += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
    if prefix:
        argv += ["--ro-bind", prefix, prefix]
    # the root bwrap builds and its /dev are tmpfs folders: remounted read-only, the `tmp_mb` tmpfs at
    # /tmp is the only place the program can write
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
             "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp",
             python, "-I", "-c", _HARNESS, role, str(channel), str(requests)]
    return argv


@lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """Why bubblewrap isolation cannot run here, or None when it can (probed once)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap)"
    try:
        res = _run("pass", Limits(timeout_s=30), "bwrap")
    except SandboxUnavailable as exc:
        return str(exc)
    if res.answers[:1] != [{"op": "started", "ok": True, "names": {}}]:
        return f"bwrap cannot start a sandbox here: {res.stderr.strip()[-300:] or f'exit {res.returncode}'}"
    return None


def run_python(code: str, limits: Limits = Limits(), mode: str = "bwrap") -> SandboxResult:
    """Run `code` to its end (or its limits) and return what it printed and answered."""
    _check_mode(mode, limits)
    return _run(code, limits, mode)


MEMORY_SCOPES = ("tree", "process")


def _check_mode(mode: str, limits: Limits) -> None:
    if mode not in MODES:
        raise ValueError(f"sandbox mode {mode!r}: expected one of {MODES}")
    if limits.memory_scope not in MEMORY_SCOPES:
        raise ValueError(f"memory_scope: {limits.memory_scope!r} is not one of {', '.join(MEMORY_SCOPES)}")
    if mode == "bwrap" and (problem := isolation_problem()):
        raise SandboxUnavailable(f"{problem}; set the reward's `sandbox: unsafe-local` to run without isolation")
    if mode == "bwrap" and limits.memory_scope == "tree" and (problem := cgroup.problem()):
        raise SandboxUnavailable(f"{problem}; set the reward's `memory_scope: process` to limit each process alone "
                                 f"(then `processes` x `memory_mb` is the bound)")


def _run(code: str, limits: Limits, mode: str) -> SandboxResult:
    with Sandbox("program", {"program": code, "token": secrets.token_hex(8)}, limits, mode, checked=True) as box:
        box.next_message()
    return box.result


LINE_CAP = 4 << 20  # one message line: a value's literal (rewards.harness.VALUE_CAP) and its envelope


class Sandbox:
    """One sandboxed harness process (`rewards/harness.py`, in `role`) and the two pipes it talks
    over: JSON lines out of it (`next_message`), JSON lines into it (`send`). The host reads and
    writes without blocking, so neither side can stall it; it keeps what the process printed up to
    `output_bytes`, refuses a line longer than LINE_CAP, and stops at `deadline` (default the
    limits' wall clock from the start; two sandboxes judging one program share one)."""

    def __init__(self, role: str, request: dict, limits: Limits = Limits(), mode: str = "bwrap",
                 checked: bool = False, deadline: float | None = None):
        if not checked:  # the isolation probe itself runs a sandbox
            _check_mode(mode, limits)
        self.role, self.limits, self.mode, self.result = role, limits, mode, None
        self._request = json.dumps({**request, "limits": limits.rlimits()}).encode()
        self._deadline = deadline
        self._order: list[dict] = []
        self._inbox: list[tuple[dict, bytes]] = []
        self._outbox = bytearray()
        self.group = self.claim = None

    def __enter__(self) -> "Sandbox":
        self._open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _open(self) -> None:
        self.channel, write_end = os.pipe()
        req_read, self.requests = os.pipe()
        self.info, info_write = os.pipe()  # bwrap reports its sandbox's init pid here
        self.workdir = tempfile.mkdtemp(prefix="hindsight-sandbox-") if self.mode == "unsafe-local" else None
        fds = (write_end, req_read, info_write)
        try:
            self.proc = self._spawn(write_end, req_read, info_write, fds)
        except BaseException:
            self._release()
            raise
        finally:
            for fd in fds:
                os.close(fd)
        os.set_blocking(self.requests, False)
        self.streams = {self.proc.stdout.fileno(): bytearray(), self.proc.stderr.fileno(): bytearray(),
                        self.channel: bytearray(), self.info: bytearray()}
        self.sel = selectors.DefaultSelector()
        for fd in self.streams:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
        self.deadline = self._deadline or time.monotonic() + self.limits.timeout_s
        self.timed_out = self.truncated = self.overflowed = False
        self._exited_at = None
        try:
            self.proc.stdin.write(self._request)
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def _spawn(self, write_end: int, req_read: int, info_write: int, fds) -> subprocess.Popen:
        if self.mode == "bwrap":
            python, prefix = _interpreter()
            argv, cwd = _bwrap_argv(python, prefix, self.limits, self.role, write_end, req_read, info_write), None
            env = {"PATH": "/usr/bin:/bin"}
        else:
            argv, cwd = [sys.executable, "-I", "-c", _HARNESS, self.role, str(write_end), str(req_read)], self.workdir
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.workdir}
        if os.geteuid() == 0 and self.mode == "bwrap":  # each run its own uid: rlimits on processes are per uid
            self.claim = UidClaim(self.limits.uid_base)
        uid = self.claim.uid if self.claim else None
        self.group = self._memory_group()
        if self.group is not None:  # the launcher enters the group, then drops to the uid and execs
            argv, uid = [sys.executable, "-I", "-c", _ENTER, self.group.procs, str(-1 if uid is None else uid),
                         *argv], None
        return subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=fds, start_new_session=True,
                                user=uid, group=uid, extra_groups=[] if uid is not None else None)

    def _memory_group(self):
        """The process tree's memory cgroup, or None (`memory_scope: process`, or none can be made:
        refused by `_check_mode` in bwrap mode)."""
        if self.limits.memory_scope != "tree" or cgroup.problem():
            return None
        return cgroup.MemoryGroup(self.limits.memory_mb << 20)

    @property
    def over(self) -> bool:
        return self.timed_out or self.truncated or self.overflowed

    def send(self, line: bytes) -> None:
        """Queue one line for the harness; it goes as the pipe takes it."""
        self._outbox += line if line.endswith(b"\n") else line + b"\n"
        self._flush()

    def _flush(self) -> None:
        while self._outbox and self.requests >= 0:
            try:
                n = os.write(self.requests, self._outbox[:65536])
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the harness is gone: what it was sent no longer matters
                self._outbox.clear()
                return
            del self._outbox[:n]

    def drain(self) -> list[tuple[dict, bytes]]:
        """The messages read so far and not yet taken."""
        out, self._inbox = self._inbox, []
        return out

    def end_input(self) -> None:
        """Nothing more will be sent: the harness reads the end of its input (its pending calls fail)."""
        self._outbox.clear()
        try:
            os.close(self.requests)
        except OSError:
            pass
        self.requests = -1

    def next_message(self) -> tuple[dict, bytes] | None:
        """The next JSON line from the harness (parsed, and its bytes as they came), or None once
        nothing more can come (it ended, timed out, flooded or sent a line past LINE_CAP)."""
        while not self._inbox:
            if not self.pump():
                return None
        return self._inbox.pop(0)

    def pump(self, timeout: float = 0.1) -> bool:
        """Move what is there, for up to `timeout`; False once nothing more can come."""
        if not self.sel.get_map() or self.over:
            return False
        now = time.monotonic()
        if now > self.deadline:
            self.timed_out = True
            return False
        if self._exited_at is None and self.proc.poll() is not None:
            self._exited_at = now
        if self._exited_at is not None and now - self._exited_at > 0.5:
            return False  # unsafe-local: a detached child still holds the pipes
        self._flush()
        for key, _ in self.sel.select(timeout=min(timeout, max(self.deadline - now, 0.0))):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                self.sel.unregister(key.fd)
                continue
            self.streams[key.fd] += chunk
        out = len(self.streams[self.proc.stdout.fileno()]) + len(self.streams[self.proc.stderr.fileno()])
        if out > self.limits.output_bytes:
            self.truncated = True
            return False
        self._lines()
        return not self.overflowed

    def _lines(self) -> None:
        raw = self.streams[self.channel]
        while (end := raw.find(b"\n")) >= 0:
            line = bytes(raw[:end])
            del raw[:end + 1]
            item = _message(line)
            if item is not None:
                if len(self._order) < 8:  # the first few, for a look afterwards; the rest cost nothing kept
                    self._order.append(item)
                self._inbox.append((item, line))
        if len(raw) > LINE_CAP:  # a line that never ends within the cap: the harness is flooding
            self.overflowed = True

    def close(self) -> None:
        if self.result is not None:
            return
        try:
            self.end_input()  # the harness's call loop ends: it exits
            while self.pump():
                self._inbox.clear()
            self.sel.close()
            end_run(self.proc, init_pid(bytes(self.streams[self.info])), ended=not self.over)
            out, err = (bytes(self.streams[f.fileno()][: self.limits.output_bytes]).decode("utf-8", "replace")
                        for f in (self.proc.stdout, self.proc.stderr))
            self.proc.stdout.close()
            self.proc.stderr.close()
            self.result = SandboxResult(None if self.timed_out else self.proc.returncode, out, err, self.timed_out,
                                        self.truncated or self.overflowed, self.mode, self._order,
                                        self.group.oom_killed() if self.group else False)
        finally:
            self._release()
            for fd in (self.channel, self.info):
                try:
                    os.close(fd)
                except OSError:
                    pass
            if self.workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _release(self) -> None:
        if self.group is not None:
            self.group.close()
        if self.claim is not None:
            self.claim.release()  # after the kill: no process of the run holds the uid now
        self.group = self.claim = None


def _message(line: bytes) -> dict | None:
    """One JSON object line with an `op`, else None (the program may print anything there)."""
    try:
        item = json.loads(line)
    except ValueError:
        return None
    return item if isinstance(item, dict) and isinstance(item.get("op"), str) else None
