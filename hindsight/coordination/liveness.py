"""Liveness apart from progress: a role that stopped (SIGSTOP, a lost machine) is told from one
that is alive and slow, and a role that is alive but makes no progress is told from both.

A role reports a heartbeat every `rl.workers.heartbeat_s` from a thread of its own, and a
progress count (groups written) with each. The coordinator reads both:
- no heartbeat for `rl.workers.silent_after_s`: the role is stopped or dead;
- heartbeats, but no progress within the deadline of the work in hand (`work_deadline_s`: a
  floor plus seconds per token of its budget, so a long group is not taken for a hung one):
  the role is alive and hung (a stuck tool, a reward that never returns).
Start-up is not work: a role's beats say `loading` until its model is built, and the deadline of
the work in hand starts only then (a fresh sampler loading its model on a loaded machine is not
hung); loading gets `rl.workers.placement_timeout_s` from the first heartbeat.
Either way the coordinator writes a stall report (`rl/stalls/`: why, which role, and every
thread's Python stack) and replaces the role; nothing it had written is lost, since a part on
disk is whole and its group sealed.
"""
from __future__ import annotations

import faulthandler
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from hindsight.errors import StageError
from hindsight.fsutil import append_line


class RoleStalled(StageError):
    """A role that died, stopped reporting, or made no progress within its deadline: the
    machine's fault, not the input's, so a retry may well pass (Prefect retries it)."""
    transient = True

    def __init__(self, role: str, why: str, report: Path | None = None):
        self.role, self.why, self.report = role, why, report
        where = f" (stacks: {report})" if report else ""
        super().__init__(f"{role}: {why}{where}")


def work_deadline_s(workers, tokens: int) -> float:
    """Seconds a role may take on work of `tokens` tokens (samples x max_new_tokens x groups)
    before it counts as hung: `lease_ttl_s` plus `lease_s_per_token` a token."""
    return workers.lease_ttl_s + workers.lease_s_per_token * tokens


def tokens_per_sample(rl) -> int:
    """The most tokens one sample may take: the completion budget, or a multi-turn episode's."""
    mt = rl.rollout.multi_turn
    return mt.max_tokens if mt is not None else rl.rollout.max_new_tokens


@dataclass
class Liveness:
    """What the coordinator last heard from one role, in its own monotonic clock."""
    silent_after_s: float
    deadline_s: float
    start_s: float  # a role starting (importing torch, loading its model) is silent for up to this long
    beat_at: float = field(default_factory=time.monotonic)
    started: bool = False
    ready: bool = False  # its model built: only then does the work in hand have a deadline
    progress_at: float = field(default_factory=time.monotonic)
    progress: int = -1
    created_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None  # its first heartbeat: started_at - created_at is its start-up
    served_at: float | None = None  # its first work done (model loaded, a first group written)

    def heard(self, progress: int | None = None, now: float | None = None, loading: bool = False) -> None:
        """A message from the role; `progress` (its count of work done) when it carries one;
        `loading` while it still builds its model."""
        now = time.monotonic() if now is None else now
        if not self.started:
            self.started_at = now
        self.beat_at, self.started = now, True
        if loading:
            return
        if not self.ready:  # the work handed over while it loaded starts its deadline now
            self.ready, self.progress_at = True, max(self.progress_at, now)
        if progress is not None and progress != self.progress:
            if self.served_at is None and self.progress >= 0:
                self.served_at = now
            self.progress, self.progress_at = progress, now

    def working(self, now: float | None = None) -> None:
        """New work handed over: its deadline starts now (or once the role is ready)."""
        self.progress_at = time.monotonic() if now is None else now

    def verdict(self, now: float | None = None) -> str | None:
        """None while the role is healthy; else why it is not."""
        now = time.monotonic() if now is None else now
        if not self.started:
            if now - self.beat_at > self.start_s:
                return (f"not started within {self.start_s:g} s (rl.workers.placement_timeout_s): its first heartbeat "
                        f"never came")
            return None
        if now - self.beat_at > self.silent_after_s:
            return (f"no heartbeat for {now - self.beat_at:.0f} s (rl.workers.silent_after_s {self.silent_after_s:g}): "
                    f"stopped or gone")
        if not self.ready:
            if now - self.started_at > self.start_s:
                return (f"alive but its model not built within {self.start_s:g} s of its first heartbeat "
                        f"(rl.workers.placement_timeout_s)")
            return None
        if now - self.progress_at > self.deadline_s:
            return (f"alive but nothing written for {now - self.progress_at:.0f} s, past the deadline of the work in "
                    f"hand ({self.deadline_s:.0f} s: rl.workers.lease_ttl_s + lease_s_per_token x its tokens)")
        return None


def stall_report(folder: Path, role: str, step: int, why: str, extra: str = "") -> Path:
    """Write why `role` stalled at `step` and this process's stacks (every thread) into
    `folder`; `extra` is what the role itself said (its own stacks, when it could answer)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{step:06d}-{role}-{time.strftime('%Y%m%dT%H%M%S')}.txt"
    with open(path, "w") as fh:
        fh.write(f"{role} stalled at step {step}: {why}\n\n--- the coordinator's threads ---\n")
        fh.flush()
        faulthandler.dump_traceback(fh, all_threads=True)
        if extra:
            fh.write(f"\n--- {role}'s own report ---\n{extra}\n")
    return path


def log_role_event(path: Path, role: str, step: int, stalled: RoleStalled) -> None:
    """One line in `rl/workers.jsonl` (where the Ray pools log their deaths) for a replaced role."""
    event = {"time": time.time(), "step": step, "role": role, "worker": role, "why": stalled.why,
             "report": str(stalled.report) if stalled.report else None, "replacement": "a new process"}
    append_line(path, json.dumps(event))
