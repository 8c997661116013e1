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

The changed elements of a tensor go as two bytes each: the gap to the previous changed position
(uint8; 0 escapes to a side list of int32 gaps) and the change of the element's bit pattern
(int8; most bf16 elements that change move by one or two units in the last place; -128 escapes to
a side list of the new values). The receiver adds the changes to the bits it holds, which are the
base version's bit for bit. A tensor that shares its storage with another (a tied embedding and
`lm_head`) goes once: the other is named as its alias.
"""
from __future__ import annotations

import torch

from hindsight.transport.payload import WeightVersion, checksum

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
GAP_ESCAPE, DIFF_ESCAPE = 0, -128


class MalformedDelta(ValueError):
    """A delta whose parts do not fit what the receiver holds: a missing tensor or part, positions
    past a tensor's end, counts that disagree. Refused before anything of it is written."""


def bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s bit patterns as integers (NaN, -0.0 and +0.0 compare as the bits they are). [N]"""
    return t.contiguous().view(-1).view(_BITS[t.element_size()])


def encode_changes(old: torch.Tensor, new: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """The parts (`gaps`, `big_gaps`, `diffs`, `far`) that take `old`'s bits to `new`'s (same
    shape and dtype), or None when no bit differs."""
    ob, nb = bits(old).to(torch.int64), bits(new).to(torch.int64)                 # [N], [N]
    where = (ob != nb).nonzero().view(-1)                                          # [K] sorted
    if where.numel() == 0:
        return None
    gaps = torch.diff(where, prepend=where.new_tensor([-1]))                       # [K] >= 1
    big = gaps > 255
    diffs = nb[where] - ob[where]                                                  # [K]
    far = diffs.abs() > 127
    return {"gaps": torch.where(big, GAP_ESCAPE, gaps).to(torch.uint8),          # [K]
            "big_gaps": gaps[big].to(torch.int32),                                 # [K_big]
            "diffs": torch.where(far, DIFF_ESCAPE, diffs).to(torch.int8),        # [K]
            "far": new.contiguous().view(-1)[where[far]]}                          # [K_far] new values


def decode_changes(held: torch.Tensor, parts: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [K] int64, new values [K]) from `encode_changes`' parts, against `held` (flat,
    the base version's values, in the serving dtype)."""
    gaps = parts["gaps"].to(torch.int64)                                           # [K]
    gaps[gaps == GAP_ESCAPE] = parts["big_gaps"].to(torch.int64)
    where = gaps.cumsum(0) - 1                                                     # [K]
    diffs = parts["diffs"].to(torch.int64)                                         # [K]
    new_bits = bits(held)[where].to(torch.int64) + diffs                          # [K]
    values = new_bits.to(_BITS[held.element_size()]).view(held.dtype)              # [K]
    values[diffs == DIFF_ESCAPE] = parts["far"]
    return where, values


def aliases(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """name -> the first name whose tensor is the same storage, offset, shape and strides (tied weights)."""
    seen: dict[tuple, str] = {}
    out = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in seen:
            out[name] = seen[key]
        else:
            seen[key] = name
    return out


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
        tied = aliases(state)
        new = {k: v.detach().to("cpu", self.dtype or v.dtype, copy=True) for k, v in state.items()}
        payload = None
        if self.held is not None and self.since_full + 1 < self.full_every and new.keys() == self.held.keys():
            payload = delta(version, self.version, self.held, new, tied)
            if payload.nbytes >= sum(t.numel() * t.element_size() for t in new.values()):
                payload = None  # e.g. fp32 serving: nearly every element moves; a full copy is smaller
        self.since_full = 0 if payload is None else self.since_full + 1
        self.held, self.version = new, version
        return payload if payload is not None else self.full()

    def full(self) -> WeightVersion:
        """The whole of what receivers should hold now (for a late or a refusing one)."""
        return WeightVersion(self.version, self.held, checksum(self.held, self.version))


def delta(version: int, base: int, old: dict[str, torch.Tensor], new: dict[str, torch.Tensor],
          tied: dict[str, str] | None = None) -> WeightVersion:
    tensors: dict[str, torch.Tensor] = {}
    for name, t in new.items():
        if tied and name in tied:  # the same storage as another tensor: it changes with it
            tensors[f"{name}::alias"] = torch.tensor(list(tied[name].encode()), dtype=torch.uint8)
        elif old[name].shape != t.shape or old[name].dtype != t.dtype:  # a changed layout: this tensor whole
            tensors[f"{name}::whole"] = t
        else:
            for part, v in (encode_changes(old[name], t) or {}).items():
                tensors[f"{name}::{part}"] = v
    return WeightVersion(version, tensors, checksum(tensors, version, base), base=base)


def apply_delta(model, tensors: dict[str, torch.Tensor]) -> None:
    """Write a verified delta's changes into `model`'s own tensors (in place: the model's state
    dict shares their storage), aliases last. Every change is checked against what the model
    holds first (`MalformedDelta`), so a refused delta leaves the model as it was."""
    state = model.state_dict()
    wholes, changes, ties = _planned(state, tensors)
    with torch.no_grad():
        for name, t in wholes.items():
            state[name].copy_(t)
        for name, (where, values) in changes.items():
            state[name].view(-1)[where] = values
        for name, target in ties.items():
            if state[name].untyped_storage().data_ptr() != state[target].untyped_storage().data_ptr():
                state[name].copy_(state[target])  # the receiver does not tie them: a copy keeps it equal


PARTS = ("gaps", "big_gaps", "diffs", "far")


def _planned(state: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor]):
    """(whole tensors, name -> (positions, values), name -> alias target), each checked."""
    wholes, changes, ties = {}, {}, {}
    for key, t in tensors.items():
        name, _, part = key.rpartition("::")
        if name not in state:
            raise MalformedDelta(f"the delta names {name!r}, which this receiver does not hold")
        if part == "whole":
            if t.shape != state[name].shape or t.dtype != state[name].dtype:
                raise MalformedDelta(f"{name}: a whole tensor of {tuple(t.shape)} {t.dtype} for one of "
                                     f"{tuple(state[name].shape)} {state[name].dtype}")
            wholes[name] = t
        elif part == "alias":
            target = bytes(t.to(torch.uint8).tolist()).decode("utf-8", "replace")
            if target not in state or state[target].shape != state[name].shape:
                raise MalformedDelta(f"{name}: an alias of {target!r}, which this receiver does not hold alike")
            ties[name] = target
        elif part == "gaps":
            changes[name] = _changes(name, state[name], tensors)
        elif part not in PARTS:
            raise MalformedDelta(f"{key}: not a part of a delta")
    return wholes, changes, ties


def _changes(name: str, held: torch.Tensor, tensors: dict[str, torch.Tensor]):
    parts = {p: tensors.get(f"{name}::{p}") for p in PARTS}
    if any(v is None for v in parts.values()):
        raise MalformedDelta(f"{name}: the delta lacks {[p for p, v in parts.items() if v is None]}")
    gaps, diffs = parts["gaps"], parts["diffs"]
    if gaps.dim() != 1 or gaps.shape != diffs.shape or parts["far"].dtype != held.dtype:
        raise MalformedDelta(f"{name}: its parts disagree in length or dtype with what the receiver holds")
    if int((gaps == GAP_ESCAPE).sum()) != parts["big_gaps"].numel() or \
            int((diffs == DIFF_ESCAPE).sum()) != parts["far"].numel():
        raise MalformedDelta(f"{name}: its escapes and side lists disagree in count")
    if parts["big_gaps"].numel() and int(parts["big_gaps"].min()) < 1:
        raise MalformedDelta(f"{name}: a gap below 1")
    flat = held.view(-1)
    total = int(gaps.to(torch.int64).sum()) + int(parts["big_gaps"].to(torch.int64).sum())  # an escape is 0
    if total > flat.numel():  # the last position is total - 1
        raise MalformedDelta(f"{name}: positions run to {total - 1}, past its {flat.numel()} elements")
    return decode_changes(flat, parts)
