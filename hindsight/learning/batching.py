"""How the learner cuts a step's batch so that its memory is a token budget, not the batch size.

A step's rows are split into mini-batches of whole groups (one optimizer step each), and each
mini-batch into micro-batches of whole sequences whose padded size stays within
`rl.learner.micro_batch_tokens` (`experience.micro_batches`, which the no-grad forwards use too);
gradients accumulate over a mini-batch's micro-batches. Every loss is divided by the whole
mini-batch's denominators (`Totals`), so the micro-batches' losses add up to the mini-batch's
loss exactly, whatever the budget. In the learner group each rank takes its groups of each
mini-batch (`padded_share`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hindsight.maths.experience import Experience, lengths


@dataclass(frozen=True)
class Totals:
    """The denominators of a mini-batch's losses: its completion tokens and its sequences."""
    tokens: float
    seqs: float

    @classmethod
    def of(cls, mask: torch.Tensor) -> "Totals":
        """mask: (B, T) completion mask of the whole mini-batch."""
        return cls(tokens=float(mask.sum()), seqs=float(mask.size(0)))


def mini_batches(n_rows: int, group_size: int, size: int | None) -> list[list[int]]:
    """Row indices of each mini-batch: `size` rows of whole groups, in order; None: one batch."""
    if not size or size >= n_rows:
        return [list(range(n_rows))]
    step = max(group_size, size - size % group_size)  # whole groups: a group's rows stay together
    return [list(range(at, min(at + step, n_rows))) for at in range(0, n_rows, step)]


def padding_fraction(exp: Experience, parts: list[list[int]]) -> float:
    """Share of the micro-batches' padded tokens that are padding."""
    p_len, c_len = lengths(exp)
    padded = sum(len(r) * (max(p_len[i] for i in r) + max(c_len[i] for i in r)) for r in parts)
    real = sum(p_len) + sum(c_len)
    return 1.0 - real / max(padded, 1)


def share(group_ids: list[int], rank: int, world: int) -> list[int]:
    """Rows of this process's share: whole groups, dealt round-robin, so every group stays on one process."""
    groups = sorted(set(group_ids))
    mine = set(groups[rank::world])
    return [i for i, g in enumerate(group_ids) if g in mine]


def padded_share(group_ids: list[int], rank: int, world: int) -> tuple[list[int], float | None]:
    """This process's rows, and a loss scale override. A process with no group (fewer groups kept
    than processes) still runs forward and backward on one row at weight 0: every rank joins
    each gradient all-reduce, and a rank that skipped one would hang the others."""
    index = share(group_ids, rank, world)
    return (index, None) if index else ([0], 0.0)
