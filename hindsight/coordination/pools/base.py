"""The worker-pool contract, and the lease loop every pool runs.

A pool is where the run's rollout workers and scorers run: in the stage's process (`local`), as
Ray actors (`ray`), or in the sampler process beside the learner (`subprocess`). The run asks
each pool the same things: publish a weights version, sample a step's groups (`submit`, then
`collect`), score groups, its metrics, close. Whether a pool samples ahead of the learner is a
capability (`hindsight.rollout.pools`); when it does is the run's policy (`Rollouts`).

Groups are leased through the ledger, the same way in every pool (`open_groups`, `leases`): a
group whose part is on disk is sealed and never sampled again, and a sampling batch goes whole
to one holder, so what a group holds does not depend on who sampled it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, ClassVar, Iterator

from hindsight.coordination.roles import deal
from hindsight.rollout.pools import Capabilities
from hindsight.rollout.tasks import GroupTask, batch_of, with_batch_mates


@dataclass
class PoolContext:
    """What any pool is built from: the run's config, its policy and paths, its store and ledger."""
    cfg: object
    policy: object          # the learner's serving model: in-process workers share it
    policy_path: str        # the folder the learner started from (what a worker process loads)
    init_path: str
    tok: object
    store: object
    ledger: object
    version: int            # the weights version the policy holds now
    rm_path: str | None
    pad_id: int


@dataclass
class Collected:
    """A collected step: the groups sealed, and what the pool scored while sampling (the
    sampler process scores as it samples; the others leave scoring to the step's scoring)."""
    groups: list[int] = field(default_factory=list)
    failures: dict = field(default_factory=dict)   # reward -> [failed calls, first failure]
    scored: int = 0                                 # completions scored


class WorkerPool(ABC):
    """One placement of the run's workers. Subclasses register in `hindsight.rollout.pools.POOLS`."""
    name: ClassVar[str]
    summary: ClassVar[str]                 # "<setting> runs ...": the start of a refusal's sentence
    capabilities: ClassVar[Capabilities]

    on_progress: Callable[[], None] = staticmethod(lambda: None)  # told when a role is replaced
    reward_worker = None  # the guarded reward process in the stage's process, which evaluation shares

    @classmethod  # noqa: B027  (most pools have nothing to check)
    def preflight(cls, cfg) -> None:
        """Before any model loads: refuse what this machine or cluster cannot hold."""

    @abstractmethod
    def publish(self, version: int, policy) -> dict[str, float]:
        """A new weights version to every worker, through the pool's own transport."""

    @abstractmethod
    def submit(self, step: int, tasks: list[GroupTask], version: int) -> None:
        """Lease the open groups among `tasks` (one round of a step) to sample with weights `version`."""

    @abstractmethod
    def collect(self, step: int) -> Collected:
        """Wait until the submitted groups of `step` are sealed (written by a worker)."""

    @abstractmethod
    def score(self, step: int, groups: list[int]) -> list[dict]:
        """Score `groups` (a part each); the reward failures of each call."""

    def sample_metrics(self) -> dict[str, float]:
        return {}

    def score_metrics(self) -> dict[str, float]:
        return {}

    def children(self) -> list[tuple]:
        """(name, pid, log) of the processes a stall report asks for their stacks."""
        return []

    def close(self) -> None:  # noqa: B027  (a pool with nothing to stop)
        """Stop the pool's workers and processes."""


class InStepPool(WorkerPool):
    """A pool that samples when the run collects (rl.async.max_staleness: 0): `submit` opens the
    round's groups and keeps them, `collect` takes them (`_take`) and runs the lease loop."""

    def __init__(self, ctx: PoolContext):
        self.ctx = ctx
        self._work: dict[int, tuple] = {}  # step -> (open tasks, the round's tasks, version), until collected

    def submit(self, step: int, tasks: list[GroupTask], version: int) -> None:
        self._work[step] = (open_groups(self.ctx.ledger, self.ctx.store, step, tasks), tasks, version)

    def _take(self, step: int) -> tuple[list[GroupTask], list[GroupTask], int]:
        return self._work.pop(step)


def open_groups(ledger, store, step: int, tasks: list[GroupTask]) -> list[GroupTask]:
    """Open the tasks' groups in the ledger; returns those still to sample. A group whose part an
    earlier attempt wrote is sealed by it (a part is written whole or not at all), and the leases
    of an interrupted attempt (a Prefect task retry, a replaced process) go back to pending."""
    ledger.open(step, [t.group for t in tasks])
    ledger.take_back(step)
    entries = ledger.read(step)
    parts = store.with_parts("rollouts", step, [t.group for t in tasks])
    written = [t.group for t in tasks if entries[t.group].state == "pending" and t.group in parts]
    if written:
        ledger.move(step, written, "sealed")
    return [t for t in tasks if entries[t.group].state == "pending" and t.group not in written]


def leases(ledger, step: int, todo: list[GroupTask], tasks: list[GroupTask], holders: list[str],
           groups_per_batch: int, ttl_s: Callable[[int], float]) -> Iterator[tuple[str, list[GroupTask]]]:
    """Deal `todo` to `holders`, each sampling batch whole to one, with the batch's written groups
    as mates not to write (sampled again so the batch is what it was); lease each share's groups
    to its holder for `ttl_s(len(share))` and yield (holder, share) for each share with work."""
    todo = with_batch_mates(todo, tasks, groups_per_batch)
    for holder, share in zip(holders, deal(todo, len(holders), partial(batch_of, groups_per_batch=groups_per_batch))):
        mine = [t.group for t in share if t.write]
        if mine:
            ledger.move(step, mine, "leased", worker=holder, ttl_s=ttl_s(len(share)))
            yield holder, share
