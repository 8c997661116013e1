"""The asynchronous sampler (`rl.async.max_staleness: k >= 1`): a rollout worker and a scorer in a
process of their own, so sampling and scoring step s overlap the learner training steps
s - k .. s - 1, and the learner's process only trains.

The schedule is fixed, not "as fast as it can": step s is always sampled with weights version
s - k (version 0 for s < k). The coordinator submits step s the moment version s - k exists,
sends each new version as it is made, and reads results in order. A run is then as
deterministic as a synchronous one, and the store holds the k steps ahead of the weights,
which a resume trains on instead of sampling them again.

The child process owns a policy copy, the scorer's models and the store's part files; the
coordinator keeps the ledger. They talk over two pipes: JSON headers, and weights as safetensors
bytes through the pipe transport (`transport.pipe`: no pickle, a checksum the child checks, an
ack back on the result pipe). If the coordinator dies (SIGKILL included), the kernel kills the child
(PR_SET_PDEATHSIG), and a part it was writing is either whole or absent.

The child says it is alive every `rl.workers.heartbeat_s`, with its count of groups written
(`coordination.liveness`). A child that died, went silent (SIGSTOP) or wrote nothing within the
deadline of the step in hand is killed by `wait`, which raises `RoleStalled` after writing a stall
report (the coordinator's stacks, and the child's own, which it dumps on SIGUSR1 when it can).
"""
from __future__ import annotations

import faulthandler
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch

from hindsight.coordination.liveness import Liveness, RoleStalled, stall_report, tokens_per_sample, work_deadline_s
from hindsight.errors import StageError
from hindsight.rollout.tasks import GroupTask
from hindsight.transport.delta import Publication
from hindsight.transport.pipe import PipeSender, recv, send


@dataclass(frozen=True)
class SamplerSpec:
    """What the child needs to build its worker (sent as JSON)."""
    rl: object
    policy_path: str
    dtype: str
    seed: int
    store_root: str
    init_path: str
    version: int
    threads: int
    rm_path: str | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "rl": self.rl.model_dump(mode="json", by_alias=True)}

    @classmethod
    def from_json(cls, d: dict) -> "SamplerSpec":
        from hindsight.config import RLConfig

        return cls(**{**d, "rl": RLConfig.model_validate(d["rl"])})


def version_for(step: int, k: int) -> int:
    """The weights version step `step` is sampled with: exactly step - k, or the initial weights."""
    return max(step - k, 0)


def split_threads(cores: int) -> tuple[int, int]:
    """(sampler, learner) intra-op threads on a CPU: the two run at once, so they split the cores."""
    sampler = max(1, cores // 2)
    return sampler, max(1, cores - sampler)


def batch_tokens(rl) -> int:
    """The token budget of one batch the sampler samples: what its deadline scales with."""
    return rl.rollout.groups_per_batch * rl.samples_per_prompt * tokens_per_sample(rl)


class AsyncSampler:
    role = "async sampler"

    def __init__(self, spec: SamplerSpec, log_path: Path, stalls: Path):
        w = spec.rl.workers
        self.liveness = Liveness(w.silent_after_s, work_deadline_s(w, batch_tokens(spec.rl)), w.placement_timeout_s)
        self.stalls = stalls
        cmd_r, self._cmd_w = os.pipe()
        self._res_r, res_w = os.pipe()
        # a fresh interpreter, not multiprocessing's spawn, which would re-import the caller's
        # __main__ (a user's script without a main guard would run again in the child)
        code = f"from hindsight.coordination.sampler import serve; serve({cmd_r}, {res_w})"
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(cmd_r, res_w), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        os.close(cmd_r), os.close(res_w)
        self._cmd = _Outbox(os.fdopen(self._cmd_w, "wb"))
        self.results: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name="hindsight-sampler-results").start()
        self.submitted: dict[int, list[int]] = {}  # step -> groups asked for
        self.finished: dict[int, list[int]] = {}
        self.weights = PipeSender(self._cmd, Publication(getattr(torch, spec.dtype), spec.rl.rollout.publish_full_every))
        send(self._cmd, {"kind": "start", "spec": spec.to_json()})

    def _read(self) -> None:
        with os.fdopen(self._res_r, "rb") as fh:
            while (msg := recv(fh)) is not None:
                self.liveness.heard(msg[0].get("progress"), loading=msg[0].get("loading", False))
                if msg[0]["kind"] != "beat":
                    self.results.put(msg[0])

    def publish(self, version: int, model) -> dict[str, float]:
        return self.weights.publish(version, model)

    def submit(self, step: int, tasks: list[GroupTask], version: int) -> None:
        self.submitted[step] = [t.group for t in tasks if t.write]
        send(self._cmd, {"kind": "sample", "step": step, "version": version, "tasks": [asdict(t) for t in tasks]})

    def wait(self, step: int) -> dict:
        """{"groups": written, "failures": reward failures}, once the sampler has sampled and scored
        `step` (results come in order).
        A slow sampler is waited for; a dead, silent or hung one raises `RoleStalled`, killed."""
        self.liveness.working()
        while step not in self.finished:
            try:
                msg = self.results.get(timeout=min(1.0, self.liveness.silent_after_s / 4))
            except queue.Empty:
                if self.proc.poll() is not None:
                    raise RoleStalled(self.role, f"the process died (exit {self.proc.returncode}) before finishing "
                                                 f"step {step} (its log: {self.log_path})") from None
                why = self.liveness.verdict()
                if why is not None:
                    raise RoleStalled(self.role, why, self._report(step, why)) from None
                continue
            if msg["kind"] == "error":
                raise StageError(f"rl.async: the sampler failed on step {msg['step']}: {msg['error']}")
            if msg["kind"] == "ack":
                if not msg["ok"]:
                    raise StageError(f"rl.async: the sampler refused weights version {msg['version']}: {msg['why']}")
                continue
            self.finished[msg["step"]] = msg
        return self.finished.pop(step)

    def _report(self, step: int, why: str) -> Path:
        """Ask the child for its stacks (SIGUSR1: faulthandler writes them to its log), then kill
        it and write the stall report; a stopped child cannot answer, and the report says so."""
        state = _proc_state(self.proc.pid)
        logged = self.log_path.stat().st_size if self.log_path.exists() else 0
        if state != "T":
            os.kill(self.proc.pid, signal.SIGUSR1)
            time.sleep(1.0)
        self.proc.kill()
        self.proc.wait()
        with open(self.log_path, "rb") as fh:
            fh.seek(logged)
            said = fh.read().decode("utf-8", "replace").strip()
        extra = said if state != "T" else f"its state was T (stopped, pid {self.proc.pid}): it could not answer"
        return stall_report(self.stalls, "sampler", step, why, extra)

    def close(self) -> None:
        try:
            send(self._cmd, {"kind": "stop"})
            self._cmd.close(timeout=10)
            self.proc.wait(timeout=10)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


class _Outbox:
    """The command pipe, written by a thread of its own: a stopped child reads nothing, and a write
    into its full pipe would block the coordinator, which must stay free to see the silence."""

    def __init__(self, fh):
        self.fh, self.queue = fh, queue.Queue()
        self.thread = threading.Thread(target=self._write, daemon=True, name="hindsight-sampler-commands")
        self.thread.start()

    def write(self, data: bytes) -> None:
        self.queue.put(bytes(data))

    def flush(self) -> None:
        pass

    def _write(self) -> None:
        try:
            while (data := self.queue.get()) is not None:
                self.fh.write(data)
                self.fh.flush()
            self.fh.close()
        except (OSError, ValueError):  # the child is gone: what it was sent is moot
            pass

    def close(self, timeout: float) -> None:
        self.queue.put(None)
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise OSError("the sampler did not read its commands")


def _proc_state(pid: int) -> str:
    """A process's state letter from /proc (T: stopped); '?' where /proc cannot say."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def _beat(results, lock: threading.Lock, every_s: float, held: dict) -> None:
    """The child's heartbeat, from a thread of its own: alive, and the groups its worker (in
    `held` once built) has written."""
    while True:
        try:
            with lock:
                beat = {"progress": held["worker"].groups_written} if held else {"loading": True}
                send(results, {"kind": "beat", **beat})
        except (OSError, ValueError):  # the pipe closed: the sampler is stopping, or its coordinator is gone
            return
        time.sleep(every_s)


def _die_with_parent() -> None:
    """Ask the kernel to kill this process when its parent dies (Linux); elsewhere the closed
    command pipe ends it at its next read."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def serve(cmd_fd: int, res_fd: int) -> None:
    """The sampler process: build the worker, then take weights and steps in order."""
    _die_with_parent()
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # stacks for a stall report
    import torch

    from hindsight.rollout.worker import RolloutWorker
    from hindsight.scoring.scorer import Scorer
    from hindsight.transport.payload import CorruptWeights, from_bytes

    inbox: queue.Queue = queue.Queue()

    def drain(fh) -> None:
        """Read commands as they come, also while a step is being sampled: the coordinator's
        write of a new weights version then never waits for the current step to finish."""
        while (msg := recv(fh)) is not None:
            inbox.put(msg)
        inbox.put(None)

    with os.fdopen(cmd_fd, "rb") as commands, os.fdopen(res_fd, "wb") as results:
        threading.Thread(target=drain, args=(commands,), daemon=True).start()
        worker, lock = None, threading.Lock()
        said = partial(_locked_send, results, lock)
        while (msg := inbox.get()) is not None:
            header, payload = msg
            if header["kind"] == "stop":
                return
            if header["kind"] == "start":
                spec = SamplerSpec.from_json(header["spec"])
                held: dict = {}  # the worker, once it and its scorer are built: beats start before they load
                threading.Thread(target=_beat, args=(results, lock, spec.rl.workers.heartbeat_s, held),
                                 daemon=True).start()
                torch.set_num_threads(spec.threads)
                worker = RolloutWorker.from_paths("sampler", spec.policy_path, spec.dtype, spec.rl,
                                                  spec.seed, spec.store_root, spec.init_path)
                worker.start_at(spec.version)
                scorer = Scorer.from_paths("sampler-scorer", spec.rl, spec.init_path, spec.rm_path, spec.dtype,
                                           spec.store_root)
                held["worker"] = worker  # ready: its beats now carry progress, and its work a deadline
            elif header["kind"] == "weights":
                try:
                    ack = worker.receive(from_bytes(header, payload))
                    ack = {"version": ack.version, "ok": ack.ok, "why": ack.why}
                except CorruptWeights as exc:  # not even readable: refused like a bad checksum
                    ack = {"version": header.get("version"), "ok": False, "why": str(exc)}
                said({"kind": "ack", **ack})
            else:
                step = header["step"]
                try:
                    tasks = [GroupTask(**t) for t in header["tasks"]]
                    written = worker.generate(tasks, header["version"])
                    failures = scorer.score(step, written) if written else {}
                    said({"kind": "done", "step": step, "groups": written, "failures": failures,
                          "engine": worker.engine_published})
                except Exception as exc:  # reported to the coordinator, which fails the step with it
                    said({"kind": "error", "step": step,
                          "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"})


def _locked_send(fh, lock: threading.Lock, header: dict) -> None:
    with lock:  # the heartbeat thread writes to the same pipe
        send(fh, header)
