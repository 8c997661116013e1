"""Surviving an MLflow outage: what cannot reach the tracking server waits in the run directory.

While the server is unreachable, every tracking write of a run (metrics, tags, params,
artifacts, the final status, the model registration) is appended to
`RUN_DIR/mlflow-spool/ops.jsonl`; an artifact is copied beside it first, since the file may
change before it is sent. Training does not wait: after one failed call the tracker is
offline and writes go straight to the spool; every `RETRY_S` one call tries the server
again, and the first that gets through replays the spool, in order. `hindsight sync RUN_DIR`
replays it by hand, including a registration that could not happen.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

from hindsight.state.rundir import RunDir

from hindsight.fsutil import append_line, atomic_write_json, read_json

log = logging.getLogger("hindsight.tracking")
RETRY_S = 30.0


def unreachable(exc: BaseException) -> bool:
    """Is this the tracking server being down (as opposed to a bad request)?"""
    text = f"{type(exc).__name__}: {exc}"
    return isinstance(exc, (ConnectionError, TimeoutError)) or any(s in text for s in (
        "Max retries exceeded", "Connection refused", "ConnectionError", "Failed to establish", "timed out",
        "RemoteDisconnected", "Connection aborted", "NewConnectionError",
        # a server killed while it answered: the response is cut (urllib3's ProtocolError)
        "Connection broken", "IncompleteRead", "ChunkedEncodingError"))


_ADDING = threading.Lock()


class Spool:
    def __init__(self, run_dir: str | Path):
        # absolute: a spooled path must name its file from wherever `hindsight sync` runs, and
        # the replay refuses any path that is not absolute and inside the run directory
        self.dir = RunDir(os.path.abspath(run_dir)).spool
        self.ops = self.dir / "ops.jsonl"
        self.done = self.dir / "done.json"          # how many ops of ops.jsonl are replayed
        self.registered = self.dir / "registered.json"  # run_id -> version, for registrations replayed

    def add(self, op: str, uri: str, run_id: str, **payload) -> None:
        # several tracking threads spool at once when the server goes down (metrics, traces,
        # artifacts): one at a time, so the folder is recorded once and no line interleaves another
        with _ADDING:
            self._add(op, uri, run_id, **payload)

    def _add(self, op: str, uri: str, run_id: str, **payload) -> None:
        if not self.dir.exists():
            RunDir(self.dir.parent).record(self.dir.name)
        if op == "artifact":  # a copy: the file may be rewritten before it is sent
            src = Path(payload["path"])
            keep = self.dir / "files" / uuid.uuid4().hex[:12] / src.name
            keep.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, keep)
            payload["path"] = str(keep)
        if "local_dir" in payload:
            payload["local_dir"] = os.path.abspath(payload["local_dir"])
        append_line(self.ops, json.dumps({"op": op, "uri": uri, "run_id": run_id, "time": time.time(), **payload},
                                         default=str))

    def pending(self) -> list[tuple[int, dict | None]]:
        """(line number, operation) of what is not replayed yet; None for a line that is not JSON.
        Only the last line can be torn by a crash mid-append: it is left out, as never complete."""
        if not self.ops.exists():
            return []
        lines = self.ops.read_text(encoding="utf-8", errors="replace").splitlines()
        start = (read_json(self.done, default={}) or {}).get("count", 0)
        out = []
        for lineno, line in enumerate(lines[start:], start=start + 1):
            if not line.strip():
                continue
            try:
                out.append((lineno, json.loads(line)))
            except ValueError:
                if lineno == len(lines):
                    continue
                out.append((lineno, None))
        return out

    def replay(self, apply, check) -> int:
        """`check(op, where)` then `apply(op)` each pending op in order; stops at the first failure
        (which raises), a malformed or refused line included. Progress is recorded after each op,
        so a second replay never sends one twice."""
        n = 0
        for lineno, op in self.pending():
            check(op, f"{self.ops}:{lineno}")
            result = apply(op)
            if op["op"] == "register":
                atomic_write_json(self.registered, {**(read_json(self.registered, default={}) or {}),
                                                    op["run_id"]: str(result)})
            n += 1
            atomic_write_json(self.done, {"count": lineno})
        return n

    def registered_version(self, run_id: str) -> str | None:
        return (read_json(self.registered, default={}) or {}).get(run_id)


class Outage:
    """Offline or online, per tracking URI, for this process."""

    def __init__(self):
        self.retry_at: dict[str, float] = {}
        self.lock = threading.Lock()

    def offline(self, uri: str) -> bool:
        with self.lock:
            return uri in self.retry_at and time.monotonic() < self.retry_at[uri]

    def went_down(self, uri: str, spool: Spool, exc: BaseException) -> None:
        with self.lock:
            first = uri not in self.retry_at
            self.retry_at[uri] = time.monotonic() + RETRY_S
        if first:
            log.warning("MLflow at %s is unreachable (%s): training goes on, tracking writes wait in %s and are "
                        "sent when it is back (or by `hindsight sync %s`)", uri, str(exc).splitlines()[0][:200],
                        spool.ops, spool.dir.parent)

    def came_back(self, uri: str) -> bool:
        with self.lock:
            return self.retry_at.pop(uri, None) is not None


OUTAGE = Outage()
