"""Reward calls in a separate, persistent process, so a hanging reward costs at most its timeout.

A thread cannot be killed; a process can. The worker is started once and reused across steps;
a call that overruns its timeout kills the worker, and the next call starts a fresh one. It is a
fresh interpreter (`python -c`, with the parent's import path), not a fork (the parent holds
torch and Prefect threads) and not multiprocessing's spawn, which re-imports the caller's
`__main__`: a user's script without a main guard would start its training again in the worker.
The two talk through multiprocessing's `Connection` over a socket pair.

The worker says it is alive every `heartbeat_s` from a thread of its own, so the parent tells a
slow reward (beats go on; its timeout applies, then the fallback) from a worker that stopped
(SIGSTOP, a frozen container, a hang that holds the GIL): no beat for `silent_after_s`. A silent
worker is replaced and the call made once more on the fresh one, so a stopped process costs the
score nothing; silent twice, the call is a timeout.
"""
from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from multiprocessing import current_process
from multiprocessing.connection import Connection


log = logging.getLogger(__name__)
# how long a fresh worker may take to say it is up (an interpreter and our imports: 0.1 s here, more
# on a loaded machine) before it counts as silent
STARTUP_S = 30.0


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


class _Silent(Exception):
    """No beat from the worker for `silent_after_s`."""


def serve_fd(fd: int, heartbeat_s: float = 1.0) -> None:
    """The worker process's entry: serve calls on the socket `fd` until told to stop."""
    conn = Connection(fd)
    # the parent's key first: a tensor in a reward's result goes back through torch's shared-memory
    # reduction, whose fd handover authenticates with it (spawn's children inherit it)
    current_process().authkey = conn.recv_bytes()
    locked = _Locked(conn)
    threading.Thread(target=_beat, args=(locked, heartbeat_s), daemon=True).start()  # before any import
    _serve(locked)


class _Locked:
    """The connection, with sends from the beat thread and the serving loop never interleaved."""

    def __init__(self, conn):
        self.conn, self.lock = conn, threading.Lock()

    def send(self, obj) -> None:
        with self.lock:
            self.conn.send(obj)

    def recv(self):
        return self.conn.recv()


def _beat(conn: _Locked, every_s: float) -> None:
    """A beat at once (the worker is up), then every `every_s`."""
    while True:
        try:
            conn.send(("beat", None))
        except OSError:  # the parent closed its end: the serving loop ends the process
            return
        time.sleep(every_s)


def _serve(conn: _Locked) -> None:
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
    @classmethod
    def for_run(cls, rl) -> "RewardWorker | None":
        """The run's reward worker (None when its rewards run inline), beating as its roles do."""
        if rl.scoring.isolation != "process":
            return None
        return cls(rl.workers.heartbeat_s, rl.workers.silent_after_s)

    def __init__(self, heartbeat_s: float = 1.0, silent_after_s: float = 30.0):
        self._proc = None
        self._conn = None
        self.heartbeat_s, self.silent_after_s = heartbeat_s, silent_after_s
        self.replaced = 0  # workers found silent and replaced
        self._heard_once = False  # a fresh worker's interpreter start is not a silence

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        mine, theirs = socket.socketpair()
        code = f"from hindsight.scoring.guarded import serve_fd; serve_fd({theirs.fileno()}, {self.heartbeat_s!r})"
        self._proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),),
                                      stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        theirs.close()
        self._conn = Connection(mine.detach())
        self._conn.send_bytes(bytes(current_process().authkey))
        self._heard_once = False

    def call(self, spec: str, kwargs: dict, timeout_s: float) -> list:
        """`fn(**kwargs)` in the worker process, bounded by `timeout_s`; a worker that falls
        silent is replaced and the call made again, once."""
        for attempt in (1, 2):
            self._ensure()
            try:
                while self._conn.poll(0):  # beats sent while no call was waiting: stale
                    self._conn.recv()
                    self._heard_once = True
            except (EOFError, OSError):  # it died since: a fresh one
                self.close(kill=True)
                self._ensure()
            self._conn.send((spec, kwargs))
            try:
                status, payload = self._answer(spec, timeout_s)
                break
            except _Silent:
                pid = self._proc.pid
                self.close(kill=True)
                self.replaced += 1
                log.warning("reward worker pid %d sent no heartbeat for %gs (stopped, or hung holding the "
                            "interpreter) during %s: replaced%s", pid, self.silent_after_s, spec,
                            ", the call made again" if attempt == 1 else "; silent twice, the call is a timeout")
        else:
            raise RewardTimeout(f"reward {spec}: its worker fell silent twice (rl.workers.silent_after_s "
                                f"{self.silent_after_s:g})")
        if status == "error":
            raise RewardRaised(payload)
        if status == "exit":
            raise RewardExited(payload)
        return payload

    def _answer(self, spec: str, timeout_s: float) -> tuple:
        """The worker's answer to the call just sent, skipping its beats; raises `RewardTimeout`
        past `timeout_s` (the worker beating: a slow reward) and `_Silent` with no beat for
        `silent_after_s` (the worker stopped; a fresh one has `STARTUP_S` to say it is up)."""
        now = time.monotonic()
        deadline, heard = now + timeout_s, now
        while True:
            now = time.monotonic()
            silent_after = self.silent_after_s if self._heard_once else max(self.silent_after_s, STARTUP_S)
            if now >= deadline:
                self.close(kill=True)
                raise RewardTimeout(f"reward {spec} ran past its {timeout_s:g}s timeout")
            if now >= heard + silent_after:
                raise _Silent()
            if not self._conn.poll(min(deadline, heard + silent_after) - now):
                continue
            try:
                status, payload = self._conn.recv()
            except EOFError:
                self.close(kill=True)
                raise RewardCrashed(f"reward {spec} killed its worker process") from None
            heard, self._heard_once = time.monotonic(), True
            if status != "beat":
                return status, payload

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
