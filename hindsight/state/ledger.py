"""The group ledger: where every (step, group) of the RL stage stands.

    pending -> leased (worker, expiry) -> sealed (its rollout part is on disk) -> scored -> trained

One JSON file per step under `rl/ledger/`, rewritten atomically on every transition by the
coordinator only (workers report to it; they never write the ledger), so a crash leaves the
previous complete state. A lease whose worker died, or whose expiry passed, goes back to
pending and is issued again; the group's seed does not change, so whoever generates it
produces the same samples. A transition that would train a group twice is refused.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hindsight.errors import CheckpointError
from hindsight.fsutil import atomic_write_json, read_json
from hindsight.state.rundir import RLDir

STATES = ("pending", "leased", "sealed", "scored", "trained")
# the transitions the coordinator may make; leased -> pending is a lease taken back
ALLOWED = {("pending", "leased"), ("leased", "sealed"), ("leased", "pending"), ("pending", "sealed"),
           ("sealed", "scored"), ("scored", "trained"), ("trained", "scored")}


@dataclass
class Entry:
    state: str = "pending"
    worker: str | None = None
    expiry: float | None = None
    leases: int = 0            # how many times it was issued (more than 1: it was reassigned)
    trained: int = 0           # how many times it was trained into the weights that are kept


class Ledger:
    def __init__(self, rl_dir: str | Path):
        self.root = RLDir(rl_dir).ledger

    def path(self, step: int) -> Path:
        return self.root / f"step-{step:06d}.json"

    def read(self, step: int) -> dict[int, Entry]:
        raw = read_json(self.path(step), default=None) or {}
        return {int(g): Entry(**e) for g, e in raw.items()}

    def _write(self, step: int, entries: dict[int, Entry]) -> None:
        # atomic but not fsynced (5 transitions a step): after a power cut a resume rolls the
        # ledger back to the newest checkpoint anyway (`roll_back_after`), which is fsynced
        atomic_write_json(self.path(step), {str(g): asdict(e) for g, e in sorted(entries.items())}, durable=False)

    def open(self, step: int, groups: list[int]) -> dict[int, Entry]:
        """The step's entries, adding any of `groups` not yet known as pending."""
        entries = self.read(step)
        new = [g for g in groups if g not in entries]
        for g in new:
            entries[g] = Entry()
        if new or not self.path(step).exists():
            self._write(step, entries)
        return entries

    def move(self, step: int, groups: list[int], to: str, worker: str | None = None, ttl_s: float | None = None):
        entries = self.read(step)
        for g in groups:
            e = entries.get(g)
            if e is None or (e.state, to) not in ALLOWED:
                raise CheckpointError(f"{self.path(step)}: group {g} cannot go from "
                                      f"{e.state if e else 'unknown'} to {to}")
            e.state = to
            if to == "leased":
                e.worker, e.expiry, e.leases = worker, time.time() + (ttl_s or 0), e.leases + 1
            elif to == "pending":
                e.worker, e.expiry = None, None
            elif to == "trained":
                e.trained += 1
            elif to == "scored" and e.trained:  # a resume rolled the weights back past this group
                e.trained -= 1
        self._write(step, entries)

    def advance(self, step: int, state: str, to: str, groups: list[int] | None = None) -> None:
        """Move the step's groups in `state` (or just `groups` among them) to `to`."""
        found = [g for g in self.in_state(step, state) if groups is None or g in groups]
        if found:
            self.move(step, found, to)

    def in_state(self, step: int, state: str) -> list[int]:
        return sorted(g for g, e in self.read(step).items() if e.state == state)

    def take_back(self, step: int, worker: str | None = None) -> list[int]:
        """Every lease of `worker` (of anyone, for None) back to pending; returns the groups."""
        groups = [g for g, e in self.read(step).items() if e.state == "leased" and (worker is None or e.worker == worker)]
        if groups:
            self.move(step, groups, "pending")
        return sorted(groups)

    def forget(self, step: int) -> None:
        """A step whose rollout shard was corrupt is sampled again: its groups start over as pending."""
        self.path(step).unlink(missing_ok=True)

    def steps(self) -> list[int]:
        return sorted(int(p.stem.split("-")[1]) for p in self.root.glob("step-*.json")) if self.root.exists() else []

    def roll_back_after(self, step: int) -> None:
        """On resume from the checkpoint at `step`: groups of later steps were trained into weights
        that were not kept, so they are scored again, not trained; leases of the dead process end."""
        for s in self.steps():
            self.take_back(s)
            if s >= step:
                trained = self.in_state(s, "trained")
                if trained:
                    self.move(s, trained, "scored")
