"""Run untrusted (model-written) Python under bubblewrap, with limits.

`mode="bwrap"` (the default) isolates what the program can reach:
- the filesystem: a new mount namespace whose root holds only `/usr` (and the interpreter's
  prefix), read-only, a fresh `/proc` and `/dev`, and a private tmpfs of `tmp_mb` at `/tmp`,
  the only writable place; no `/etc`, no home, no project source;
- processes: a new PID namespace. When the program's main process exits, or the run times
  out, bubblewrap's init dies and the kernel kills everything left in the namespace;
- the user: when hindsight runs as root, the sandbox runs as an unprivileged uid *outside*
  the namespace too (`uid_base` + a counter), so root's files are not its files;
- the network: a new network namespace with no interface (no loopback server, no TCP,
  unix sockets only on the private tmpfs), and no IPC or UTS shared with the host;
- resources: rlimits on CPU seconds, address space, processes, file size and open files
  (set by the harness before the program runs), a wall-clock timeout, and an output cap:
  past `output_bytes` the run is killed, so a flood costs the parent nothing.

`mode="unsafe-local"` runs the same harness in a plain subprocess (rlimits, a temporary
directory, an empty environment, a new session), with none of the isolation above. It is
for trusted code on machines without user namespaces, and only when a config says so.
"""
from __future__ import annotations

import itertools
import json
import os
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

MODES = ("bwrap", "unsafe-local")
_HARNESS = (Path(__file__).with_name("harness.py")).read_text(encoding="utf-8")
_UIDS = itertools.count()  # each run its own uid: rlimits on processes are per uid


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


def _bwrap_argv(python: str, prefix: str | None, limits: Limits, channel: int, info: int) -> list[str]:
    argv = ["bwrap", "--info-fd", str(info), "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session",
            "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOME", "/tmp", "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):
        if os.path.islink(f"/{link}"):
            argv += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
    if prefix:
        argv += ["--ro-bind", prefix, prefix]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
             "--chdir", "/tmp", python, "-I", "-c", _HARNESS, str(channel)]
    return argv


@lru_cache(maxsize=1)
def isolation_problem() -> str | None:
    """Why bubblewrap isolation cannot run here, or None when it can (probed once)."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed (Debian: apt-get install bubblewrap)"
    try:
        res = _run({"program": "pass", "steps": [], "limits": Limits().rlimits()}, Limits(timeout_s=30), "bwrap")
    except SandboxUnavailable as exc:
        return str(exc)
    if res.answers[:1] != [{"i": -1, "ok": True}]:
        return f"bwrap cannot start a sandbox here: {res.stderr.strip()[-300:] or f'exit {res.returncode}'}"
    return None


def run_python(code: str, limits: Limits = Limits(), mode: str = "bwrap",
               steps: list[tuple[str, str]] = ()) -> SandboxResult:
    """Run `code`, then each step (`("exec", src)` or `("eval", expr)`) in its namespace."""
    if mode not in MODES:
        raise ValueError(f"sandbox mode {mode!r}: expected one of {MODES}")
    if mode == "bwrap" and (problem := isolation_problem()):
        raise SandboxUnavailable(f"{problem}; set the reward's `sandbox: unsafe-local` to run without isolation")
    return _run({"program": code, "steps": [list(s) for s in steps], "limits": limits.rlimits()}, limits, mode)


def _run(request: dict, limits: Limits, mode: str) -> SandboxResult:
    read_end, write_end = os.pipe()
    info_read, info_write = os.pipe()  # bwrap reports its sandbox's init pid here
    workdir = tempfile.mkdtemp(prefix="hindsight-sandbox-") if mode == "unsafe-local" else None
    try:
        if mode == "bwrap":
            python, prefix = _interpreter()
            argv, cwd, env = _bwrap_argv(python, prefix, limits, write_end, info_write), None, {"PATH": "/usr/bin:/bin"}
        else:
            argv, cwd = [sys.executable, "-I", "-c", _HARNESS, str(write_end)], workdir
            env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir}
        uid = limits.uid_base + next(_UIDS) % 4096 if os.geteuid() == 0 and mode == "bwrap" else None
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(write_end, info_write), start_new_session=True,
                                user=uid, group=uid, extra_groups=[] if uid is not None else None)
        for fd in (write_end, info_write):
            os.close(fd)
        write_end = info_write = -1
        return _collect(proc, read_end, info_read, json.dumps(request).encode(), limits, mode)
    finally:
        for fd in (read_end, info_read, write_end, info_write):
            if fd >= 0:
                os.close(fd)
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def _collect(proc: subprocess.Popen, channel: int, info: int, request: bytes, limits: Limits,
             mode: str) -> SandboxResult:
    """Feed the request, read stdout, stderr and the channel until they close, the deadline
    passes or the output cap is hit; then make sure nothing of the run is left."""
    try:
        proc.stdin.write(request)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    streams = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(), channel: bytearray(),
               info: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline, timed_out, truncated, exited_at = time.monotonic() + limits.timeout_s, False, False, None
    while sel.get_map():
        now = time.monotonic()
        if now > deadline:
            timed_out = True
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.5:
            break  # unsafe-local: a detached child still holds the pipes
        for key, _ in sel.select(timeout=0.1):
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fd)
                continue
            streams[key.fd] += chunk
        if len(streams[proc.stdout.fileno()]) + len(streams[proc.stderr.fileno()]) > limits.output_bytes \
                or len(streams[channel]) > limits.output_bytes:
            truncated = True
            break
    sel.close()
    _kill(proc, _init_pid(bytes(streams[info])), ended=not (timed_out or truncated))
    out, err = (bytes(streams[f.fileno()][: limits.output_bytes]).decode("utf-8", "replace")
                for f in (proc.stdout, proc.stderr))
    proc.stdout.close()
    proc.stderr.close()
    return SandboxResult(None if timed_out else proc.returncode, out, err, timed_out, truncated, mode,
                         _answers(bytes(streams[channel])))


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


