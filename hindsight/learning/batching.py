"""How the learner cuts a step's batch so that its memory is a token budget, not the batch size.

A step's rows are split into mini-batches of whole groups (one optimizer step each), and each
mini-batch into micro-batches of whole sequences whose padded size stays within
`rl.micro_batch_tokens`; gradients accumulate over a mini-batch's micro-batches. Every loss is
divided by the whole mini-batch's denominators (`Totals`), so the micro-batches' losses add up
to the mini-batch's loss exactly, whatever the budget. Rows are sorted by length so that a
micro-batch pads little, and each is trimmed to its own widest prompt and completion.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hindsight.experience import Experience


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


def lengths(exp: Experience) -> tuple[list[int], list[int]]:
    """Real prompt and completion tokens of each row."""
    return exp.prompt_mask.sum(-1).tolist(), exp.completion_mask.sum(-1).tolist()


def micro_batches(prompt_len: list[int], completion_len: list[int], group_size: int,
                  budget: int | None) -> list[list[int]]:
    """Row indices of each micro-batch: within `budget` padded tokens (rows x (widest prompt +
    widest completion)), longest first. Whole groups are kept together when a group fits, so the
    shared-prompt forward still applies; a group larger than the budget is cut into rows, and a
    row larger than the budget is a micro-batch of its own. None: one micro-batch."""
    n = len(prompt_len)
    if not budget:
        return [list(range(n))]
    groups = [list(range(g, min(g + group_size, n))) for g in range(0, n, group_size)]
    units = []
    for g in groups:
        if len(g) * (max(prompt_len[i] for i in g) + max(completion_len[i] for i in g)) <= budget:
            units.append(g)
        else:
            units.extend([i] for i in g)
    units.sort(key=lambda u: -max(prompt_len[i] + completion_len[i] for i in u))  # stable: ties keep their order
    out, rows, p_w, c_w = [], [], 0, 0
    for unit in units:
        up, uc = max(prompt_len[i] for i in unit), max(completion_len[i] for i in unit)
        if rows and (len(rows) + len(unit)) * (max(p_w, up) + max(c_w, uc)) > budget:
            out.append(rows)
            rows, p_w, c_w = [], 0, 0
        rows, p_w, c_w = rows + unit, max(p_w, up), max(c_w, uc)
    if rows:
        out.append(rows)
    return out


def trimmed(exp: Experience, rows: list[int]) -> Experience:
    """The rows as a batch of their own, without the padding columns none of them uses: left
    padding of the prompts (positions come from the mask, so nothing moves) and right padding of
    the completions."""
    part = exp.rows(rows)
    p = int(part.prompt_mask.sum(-1).max())
    t = max(int(part.completion_mask.sum(-1).max()), 1)
    out = {}
    for k, v in vars(part).items():
        if k in ("prompt_ids", "prompt_mask"):
            v = v[:, v.size(1) - p:]                                          # (b, p)
        elif isinstance(v, torch.Tensor) and v.dim() == 2:
            v = v[:, :t]                                                      # (b, t): every token-level field
        out[k] = v
    return Experience(**out)


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
