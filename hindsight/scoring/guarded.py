"""Reward calls in a separate, persistent process, so a hanging reward costs at most its timeout.

A thread cannot be killed; a process can. The worker is spawned once (not forked: the
parent holds torch and Prefect threads) and reused across steps; a call that overruns
its timeout kills the worker, and the next call starts a fresh one.
"""
from __future__ import annotations

import multiprocessing as mp


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


def _serve(conn) -> None:
    import signal

    from hindsight.scoring.reward_fns import load_reward_fn, plain_result

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the stage decides, not the worker

    while True:
        msg = conn.recv()
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
        if self._proc is not None and self._proc.is_alive():
            return
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="hindsight-rewards")
        self._proc.start()

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
        self._proc.join(timeout=5)
        self._proc, self._conn = None, None
