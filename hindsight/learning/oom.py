"""An out-of-memory error in a micro-batch does not lose the step: the mini-batch is redone from
zeroed gradients in micro-batches of half the padded tokens, until it fits or a micro-batch is one
row. Micro-batch losses are divided by the whole mini-batch's totals, so the step lands where it
would have (to float rounding, as micro-batched equals whole). Nothing is half-applied: the
optimizer steps only after every micro-batch of a mini-batch has run.

In a learner group every rank must run the same collectives, so a rank cannot re-cut alone: there
the error stands, and says which budget to lower.
"""
from __future__ import annotations

from typing import Callable

import torch

from hindsight.errors import ConfigError


def is_out_of_memory(exc: BaseException) -> bool:
    """A device's OutOfMemoryError, or the CPU allocator's refusal (a RuntimeError)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in str(exc) or "out of memory" in str(exc))


def padded_tokens(parts: list[list[int]], widths: list[int]) -> int:
    """The largest micro-batch's padded tokens (rows x its widest row), `widths[i]` row i's."""
    return max(len(p) * max(widths[i] for i in p) for p in parts)


def split_on_oom(run: Callable[[list[list[int]]], dict], cut: Callable[[int | None], list[list[int]]],
                 budget: int | None, widths: list[int], world: int, zero: Callable[[], None]) -> tuple[dict, int]:
    """(run(parts)'s result, how many times it was redone). `cut(budget)` gives the micro-batches
    of a budget; `zero()` clears the gradients a failed attempt accumulated."""
    retries = 0
    while True:
        parts = cut(budget)
        try:
            return run(parts), retries
        except Exception as exc:  # noqa: BLE001  (only an out-of-memory error is handled; the rest re-raise)
            if not is_out_of_memory(exc):
                raise
            zero()
            if world > 1:
                raise ConfigError(f"out of memory in a micro-batch of a learner group of {world}: the ranks cannot "
                                  f"re-cut it alone; lower rl.learner.micro_batch_tokens (now {budget})") from exc
            if all(len(p) == 1 for p in parts):
                raise ConfigError("out of memory in a micro-batch of one row: lower rl.rollout.max_new_tokens or "
                                  "the prompts' length, or use model.gradient_checkpointing") from exc
            budget = max(padded_tokens(parts, widths) // 2, 1)
            retries += 1
