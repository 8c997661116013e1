"""Weights moved a bucket at a time: the one rule for cutting named tensors into buckets, used
by the fsdp2 strategy's gather (`learning.strategies.sharded`) and the vLLM push
(`rollout.engines.vllm`)."""
from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch


def nbytes(t: torch.Tensor) -> int:
    """A tensor's size in bytes (a DTensor's global size)."""
    return t.numel() * t.element_size()


def by_size(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive (name, tensor) pairs in buckets of at most `bucket_bytes`, in order; a tensor
    larger than a bucket is a bucket of its own. Lazy: nothing is read before its bucket."""
    bucket, size = [], 0
    for name, t in named:
        if bucket and size + nbytes(t) > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += nbytes(t)
    if bucket:
        yield bucket
