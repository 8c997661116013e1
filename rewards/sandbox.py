"""Run untrusted (model-written) Python in a subprocess with limits.

Limits: CPU seconds and address space (setrlimit), a wall-clock timeout that kills the
whole process group, a fresh temporary working directory, an empty environment (no
inherited secrets), `python -I` (no user site, no PYTHON* variables) and no network.

Network isolation: where `unshare -rn` works (a user + network namespace with no
interfaces), the child cannot reach any address, loopback included. Where it does not,
the weaker documented mode replaces `socket.socket` before the user code runs; that stops
ordinary socket use but not deliberately crafted code (ctypes, _socket), so run such
workloads only where namespaces are available (`network_isolated` says which mode ran).
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache

_WEAK_NET_PRELUDE = (
    "import socket as _s\n"
    "def _blocked(*a, **k):\n"
    "    raise PermissionError('network disabled in the hindsight sandbox')\n"
    "_s.socket = _blocked; _s.create_connection = _blocked\n"
)


@dataclass
class SandboxResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    network_isolated: bool

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@lru_cache(maxsize=1)
def namespaces_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _limits(cpu_s: int, memory_mb: int):
    def apply():
        os.setsid()  # own process group, so a timeout kills every child too
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        mem = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024 * 1024,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_python(code: str, timeout_s: float = 10.0, cpu_s: int = 5, memory_mb: int = 512) -> SandboxResult:
    isolated = namespaces_available()
    workdir = tempfile.mkdtemp(prefix="hindsight-sandbox-")
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as fh:
            fh.write(code if isolated else _WEAK_NET_PRELUDE + code)
        cmd = [sys.executable, "-I", "main.py"]
        if isolated:
            cmd = ["unshare", "-rn", "--"] + cmd
        proc = subprocess.Popen(cmd, cwd=workdir, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_limits(cpu_s, memory_mb))
        try:
            out, err = proc.communicate(timeout=timeout_s)
            return SandboxResult(proc.returncode, out, err, False, isolated)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return SandboxResult(None, out, err, True, isolated)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
