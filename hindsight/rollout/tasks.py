"""A group to sample, and the sampling batch it belongs to: what the lease loop deals out
(`coordination.pools`), without torch."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True)
class GroupTask:
    step: int
    group: int
    round: int
    prompt: dict     # the data row, with its "id" (and "_replayed" for a hard example)
    write: bool = True  # False: sampled only as the batch-mate of a group that is (its part exists)


def batch_of(task: GroupTask, groups_per_batch: int) -> tuple[int, int]:
    """The sampling batch a group belongs to: fixed by its index, never by who samples it."""
    return task.round, task.group // groups_per_batch


def with_batch_mates(todo: list[GroupTask], tasks: list[GroupTask], groups_per_batch: int) -> list[GroupTask]:
    """`todo`, plus the already-written groups that share a sampling batch with one of them, marked
    not to be written: they are sampled again so the batch, and so every bit of the groups that
    are written, is what it was in an uninterrupted run."""
    if groups_per_batch == 1:
        return todo
    wanted = {batch_of(t, groups_per_batch) for t in todo}
    pending = {t.group for t in todo}
    return [t if t.group in pending else replace(t, write=False)
            for t in tasks if batch_of(t, groups_per_batch) in wanted]
