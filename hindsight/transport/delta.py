"""Weight publication as deltas: after the first version, a payload carries only the elements
that changed since the version every receiver holds, in the serving dtype.

At RL learning rates most weights do not change in a step once rounded to bf16 (a step moves a
weight by about the learning rate, a bf16 ulp is 2^-8 of it), so a bf16 receiver needs only the
few elements whose bf16 bits moved. The sender keeps the serving-dtype copy every receiver
holds (`Publication.held`) and compares bit patterns, never values: a delta applied to that
copy gives it back bit for bit, whatever the dtype.

A delta names the version it applies to (`WeightVersion.base`). A receiver that does not hold
that version (it missed one, or started later) refuses it and asks for the full copy, which the
sender makes from `held`; a full copy also goes every `full_every` versions, and whenever a delta
would not be smaller than it. Payloads carry a checksum like full ones (`payload.verified`).

The changed elements of a tensor go as (positions, values): positions as uint16 offsets within
blocks of 65,536 elements plus each block's count, so a changed bf16 element costs 4 bytes, not
the 6 of an int32 index and its value.
"""
from __future__ import annotations

import torch

from hindsight.transport.payload import WeightVersion, checksum

BLOCK = 1 << 16
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class NeedsFull(ValueError):
    """A delta for a version the receiver does not hold."""


def bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bit patterns as integers (NaN, -0.0 and +0.0 compare as the bits they are). [N]"""
    return t.contiguous().view(-1).view(_BITS[t.element_size()])


def encode_changes(old: torch.Tensor, new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(offsets [K] uint16, counts [ceil(N/BLOCK)] int32, values [K]) of the elements whose bits
    differ between `old` and `new` (same shape and dtype), or None when none do."""
    where = (bits(old) != bits(new)).nonzero().view(-1)  # [K] flat positions, sorted
    if where.numel() == 0:
        return None
    blocks = (new.numel() + BLOCK - 1) // BLOCK
    counts = torch.bincount(where // BLOCK, minlength=blocks).to(torch.int32)  # [blocks]
    offsets = (where % BLOCK).to(torch.int32).to(torch.uint16)  # [K]
    return offsets, counts, new.contiguous().view(-1)[where]


def decode_positions(offsets: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The flat positions [K] (int64) that `encode_changes` wrote as offsets [K] and counts [B]."""
    block = torch.repeat_interleave(torch.arange(counts.numel(), dtype=torch.int64), counts.to(torch.int64))  # [K]
    return block * BLOCK + offsets.to(torch.int64)


class Publication:
    """The sender's side: what every receiver holds, and the next payload to send."""

    def __init__(self, dtype: torch.dtype | None = None, full_every: int = 100):
        if full_every < 1:
            raise ValueError(f"full_every must be at least 1 (1: a full copy every version), not {full_every}")
        self.dtype, self.full_every = dtype, full_every
        self.held: dict[str, torch.Tensor] | None = None  # name -> what receivers hold (CPU, serving dtype)
        self.version: int | None = None
        self.since_full = 0

    def next(self, version: int, state: dict[str, torch.Tensor]) -> WeightVersion:
        """The payload that takes a receiver holding `self.version` to `version` (`state`)."""
        new = {k: v.detach().to("cpu", self.dtype or v.dtype, copy=True) for k, v in state.items()}
        payload = None
        if self.held is not None and self.since_full + 1 < self.full_every and new.keys() == self.held.keys():
            payload = delta(version, self.version, self.held, new)
            if payload.nbytes >= sum(t.numel() * t.element_size() for t in new.values()):
                payload = None  # e.g. fp32 serving: nearly every element moves; a full copy is smaller
        self.since_full = 0 if payload is None else self.since_full + 1
        self.held, self.version = new, version
        return payload if payload is not None else self.full()

    def full(self) -> WeightVersion:
        """The whole of what receivers should hold now (for a late or a refusing one)."""
        return WeightVersion(self.version, self.held, checksum(self.held))


def delta(version: int, base: int, old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> WeightVersion:
    tensors: dict[str, torch.Tensor] = {}
    for name, t in new.items():
        if old[name].shape != t.shape or old[name].dtype != t.dtype:  # a changed layout: this tensor whole
            tensors[f"{name}::whole"] = t
            continue
        changes = encode_changes(old[name], t)
        if changes is not None:
            tensors[f"{name}::offsets"], tensors[f"{name}::counts"], tensors[f"{name}::values"] = changes
    return WeightVersion(version, tensors, checksum(tensors), base=base)


def apply_delta(model, tensors: dict[str, torch.Tensor]) -> None:
    """Write a verified delta's changes into `model`'s own tensors (in place: the model's state
    dict shares their storage)."""
    state = model.state_dict()
    with torch.no_grad():
        for key, t in tensors.items():
            name, part = key.rsplit("::", 1)
            if part == "whole":
                state[name].copy_(t)
            elif part == "values":
                flat = state[name].view(-1)
                where = decode_positions(tensors[f"{name}::offsets"], tensors[f"{name}::counts"])
                flat[where] = t.to(flat.dtype)
