"""Run untrusted (model-written) Python under bubblewrap, with limits.

`mode="bwrap"` (the default) isolates what the program can reach:
- the filesystem: a new mount namespace whose root holds only `/usr` (and the interpreter's
  prefix), read-only, a fresh `/proc`, a read-only `/dev`, and a private tmpfs of `tmp_mb` at
  `/tmp`, the only writable place (the root itself is remounted read-only); no `/etc`, no
  home, no project source;
- processes: a new PID namespace. When the program's main process exits, or the run times
  out, bubblewrap's init dies and the kernel kills everything left in the namespace;
- the user: when hindsight runs as root, the sandbox runs as an unprivileged uid *outside*
  the namespace too (`uid_base` + a counter), so root's files are not its files;
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

import itertools
import json
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rewards import cgroup

MODES = ("bwrap", "unsafe-local")
_HARNESS = (Path(__file__).with_name("harness.py")).read_text(encoding="utf-8")
_UIDS = itertools.count()  # each run its own uid: rlimits on processes are per uid
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
    answers: list[dict]            # the harness's JSON lines, in order (unparseable ones dropped)
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


def _bwrap_argv(python: str, prefix: str | None, limits: Limits, channel: int, requests: int, info: int) -> list[str]:
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
             python, "-I", "-c", _HARNESS, str(channel), str(requests)]
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
    if res.answers[:1] != [{"i": -1, "ok": True, "names": {}}]:
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
    with Session(code, limits, mode, checked=True) as session:
        session.started()
    return session.result


class Session:
    """A sandboxed program kept running after its code has run, so that the judge outside can
    call its functions (`call`) with plain-data arguments and get plain-data values back. One
    wall-clock deadline (`timeout_s`) and one output cap hold for the whole session."""

    def __init__(self, code: str, limits: Limits = Limits(), mode: str = "bwrap", checked: bool = False):
        if not checked:  # the isolation probe itself runs a session
            _check_mode(mode, limits)
        self.limits, self.mode, self.result = limits, mode, None
        self._request = json.dumps({"program": code, "limits": limits.rlimits()}).encode()
        self._answers: dict[int, dict] = {}
        self._order: list[dict] = []
        self.group = None

    def __enter__(self) -> "Session":
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
            if self.mode == "bwrap":
                python, prefix = _interpreter()
                argv, cwd = _bwrap_argv(python, prefix, self.limits, write_end, req_read, info_write), None
                env = {"PATH": "/usr/bin:/bin"}
            else:
                argv, cwd = [sys.executable, "-I", "-c", _HARNESS, str(write_end), str(req_read)], self.workdir
                env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": self.workdir}
            uid = self.limits.uid_base + next(_UIDS) % 4096 if os.geteuid() == 0 and self.mode == "bwrap" else None
            self.group = self._memory_group()
            if self.group is not None:  # the launcher enters the group, then drops to the uid and execs
                argv, uid = [sys.executable, "-I", "-c", _ENTER, self.group.procs, str(-1 if uid is None else uid),
                             *argv], None
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, pass_fds=fds, start_new_session=True,
                                         user=uid, group=uid, extra_groups=[] if uid is not None else None)
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
        self.deadline = time.monotonic() + self.limits.timeout_s
        self.timed_out = self.truncated = False
        self._exited_at = None
        self._parsed = 0
        try:
            self.proc.stdin.write(self._request)
            self.proc.stdin.close()
        except BrokenPipeError:
            pass

    def _memory_group(self):
        """The process tree's memory cgroup, or None (`memory_scope: process`, or none can be made:
        refused by `_check_mode` in bwrap mode)."""
        if self.limits.memory_scope != "tree" or cgroup.problem():
            return None
        return cgroup.MemoryGroup(self.limits.memory_mb << 20)

    def started(self) -> dict | None:
        """The program's top-level names ({name: "callable" or a literal}) once it has run, or
        None when it raised, exited or ran out of time."""
        first = self._wait(-1)
        return first.get("names", {}) if first and first.get("ok") is True else None

    def call(self, name: str, args: str, kwargs: str) -> dict:
        """Call the program's `name` with literal args; its answer ({"value": literal} or
        {"error": type name}), or {"error": "Unanswered"} when the session is over."""
        nonce = secrets.randbits(62)  # a forged answer line cannot name a call it has not seen
        try:
            os.write(self.requests, (json.dumps({"i": nonce, "name": name, "args": args, "kwargs": kwargs})
                                     + "\n").encode())
        except (BlockingIOError, BrokenPipeError, OSError):
            return {"error": "Unanswered"}
        return self._wait(nonce) or {"error": "Unanswered"}

    def _wait(self, i: int) -> dict | None:
        while i not in self._answers:
            if not self._pump():
                return None
        return self._answers.pop(i)

    def _pump(self) -> bool:
        """Read what is there (up to 0.1 s); False once nothing more can come."""
        if not self.sel.get_map() or self.timed_out or self.truncated:
            return False
        now = time.monotonic()
        if now > self.deadline:
            self.timed_out = True
            return False
        if self._exited_at is None and self.proc.poll() is not None:
            self._exited_at = now
        if self._exited_at is not None and now - self._exited_at > 0.5:
            return False  # unsafe-local: a detached child still holds the pipes
        for key, _ in self.sel.select(timeout=0.1):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                self.sel.unregister(key.fd)
                continue
            self.streams[key.fd] += chunk
        out = len(self.streams[self.proc.stdout.fileno()]) + len(self.streams[self.proc.stderr.fileno()])
        if out > self.limits.output_bytes or len(self.streams[self.channel]) > self.limits.output_bytes:
            self.truncated = True
            return False
        self._parse()
        return True

    def _parse(self) -> None:
        raw = self.streams[self.channel]
        end = raw.rfind(b"\n") + 1
        if end <= self._parsed:
            return
        for item in _answers(bytes(raw[self._parsed:end])):
            self._order.append(item)
            self._answers.setdefault(item["i"], item)  # the first answer to an id counts
        self._parsed = end

    def close(self) -> None:
        if self.result is not None:
            return
        try:
            os.close(self.requests)  # the harness's call loop ends: the program exits
            while self._pump():
                pass
            self.sel.close()
            _kill(self.proc, _init_pid(bytes(self.streams[self.info])), ended=not (self.timed_out or self.truncated))
            out, err = (bytes(self.streams[f.fileno()][: self.limits.output_bytes]).decode("utf-8", "replace")
                        for f in (self.proc.stdout, self.proc.stderr))
            self.proc.stdout.close()
            self.proc.stderr.close()
            self.result = SandboxResult(None if self.timed_out else self.proc.returncode, out, err, self.timed_out,
                                        self.truncated, self.mode, self._order,
                                        self.group.oom_killed() if self.group else False)
        finally:
            if self.group is not None:
                self.group.close()
            for fd in (self.channel, self.info):
                try:
                    os.close(fd)
                except OSError:
                    pass
            if self.workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)


def _init_pid(info: bytes) -> int | None:
    try:
        return int(json.loads(info)["child-pid"])
    except (ValueError, KeyError, TypeError):
        return None


def _kill(proc: subprocess.Popen, init_pid: int | None, ended: bool) -> None:
    """End the run. Under bwrap, SIGKILL to the sandbox's init ends its PID namespace, every
    process in it with it, and bwrap reaps it; killing bwrap first would leave that init to
    the host's pid 1 (a zombie, in a container whose init does not reap)."""
    if ended:
        try:
            proc.wait(timeout=2)  # everything closed its pipes: bwrap is about to exit by itself
            _await_exit(init_pid)
            return
        except subprocess.TimeoutExpired:
            pass
    if init_pid is not None:
        try:
            os.kill(init_pid, signal.SIGKILL)
            proc.wait(timeout=5)
        except (ProcessLookupError, PermissionError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # unsafe-local: the session; under bwrap, a last resort
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    _await_exit(init_pid)


def _await_exit(pid: int | None, grace_s: float = 1.0) -> None:
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


def _answers(raw: bytes) -> list[dict]:
    out = []
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and type(item.get("i")) is int:
            out.append(item)
    return out


