"""Reward calls in a separate, persistent process, so a hanging reward costs at most its timeout.

A thread cannot be killed; a process can. The worker is started once and reused across steps;
a call that overruns its timeout kills the worker, and the next call starts a fresh one. It is a
fresh interpreter (`python -c`, with the parent's import path), not a fork (the parent holds
torch and Prefect threads) and not multiprocessing's spawn, which re-imports the caller's
`__main__`: a user's script without a main guard would start its training again in the worker.
The two talk through multiprocessing's `Connection` over a socket pair.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from multiprocessing import current_process
from multiprocessing.connection import Connection


class RewardTimeout(Exception):
    pass


class RewardCrashed(Exception):
    pass


class RewardRaised(RuntimeError):
    """The reward raised in the worker: the message is its own `Type: message`."""


class RewardExited(Exception):
    """The reward called sys.exit(): reported like an inline reward's SystemExit."""

    def __init__(self, code):
        super().__init__(code)
        self.code = code


def serve_fd(fd: int) -> None:
    """The worker process's entry: serve calls on the socket `fd` until told to stop."""
    conn = Connection(fd)
    # the parent's key first: a tensor in a reward's result goes back through torch's shared-memory
    # reduction, whose fd handover authenticates with it (spawn's children inherit it)
    current_process().authkey = conn.recv_bytes()
    _serve(conn)


def _serve(conn) -> None:
    import signal

    from hindsight.scoring.reward_fns import load_reward_fn, plain_result

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the stage decides, not the worker

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone (it exited or was killed): so is the worker
            return
        if msg is None:
            return
        spec, kwargs = msg
        try:
            # the return value itself (not list(...) of it): the parent validates it as it would inline
            conn.send(("ok", plain_result(load_reward_fn(spec)(**kwargs))))
        except SystemExit as exc:
            conn.send(("exit", exc.code if isinstance(exc.code, (int, str, type(None))) else str(exc.code)))
        except Exception as exc:  # reported to the parent, which applies the fallback
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class RewardWorker:
    def __init__(self):
        self._proc = None
        self._conn = None

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        mine, theirs = socket.socketpair()
        code = f"from hindsight.scoring.guarded import serve_fd; serve_fd({theirs.fileno()})"
        self._proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),),
                                      stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        theirs.close()
        self._conn = Connection(mine.detach())
        self._conn.send_bytes(bytes(current_process().authkey))

    def call(self, spec: str, kwargs: dict, timeout_s: float) -> list:
        """`fn(**kwargs)` in the worker process, bounded by `timeout_s`."""
        self._ensure()
        self._conn.send((spec, kwargs))
        if not self._conn.poll(timeout_s):
            self.close(kill=True)
            raise RewardTimeout(f"reward {spec} ran past its {timeout_s:g}s timeout")
        try:
            status, payload = self._conn.recv()
        except EOFError:
            self.close(kill=True)
            raise RewardCrashed(f"reward {spec} killed its worker process") from None
        if status == "error":
            raise RewardRaised(payload)
        if status == "exit":
            raise RewardExited(payload)
        return payload

    def close(self, kill: bool = False) -> None:
        if self._proc is None:
            return
        if kill:
            self._proc.kill()
        else:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._conn.close()
        self._proc, self._conn = None, None
