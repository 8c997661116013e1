"""An exact fingerprint of weights in an inference engine's own layout, so the engine's weights
can be checked against the learner's after every push without a copy of either.

`bit_fingerprint(t, offset)` is a position-weighted sum of `t`'s bit patterns, in int64 with
wrap-around: integer addition is associative, so the sum does not depend on how it is chunked or
reduced (CPU or GPU), and it is linear in position, so the fingerprint of a concatenation is the
sum of its parts' fingerprints at their offsets. That is what lets the learner's Hugging Face
tensors (q, k and v apart) be compared with vLLM's fused ones (one qkv tensor) without building
the fused tensor: `layout_fingerprints` sums the parts at their row offsets. Any one changed
element changes it (every weight is odd); it is a guard against a wrong push, not a cryptographic
hash.
"""
from __future__ import annotations

import torch

from hindsight.transport.delta import bits

_CHUNK = 1 << 22  # elements a pass: bounds the int64 temporaries (32 MiB each)
_MASK = (1 << 64) - 1


def _signed(x: int) -> int:
    x &= _MASK
    return x - (1 << 64) if x >= 1 << 63 else x


def bit_fingerprint(t: torch.Tensor, offset: int = 0) -> int:
    """Sum over i of bits(t)[i] * w(offset + i) mod 2^64, w odd and position-dependent. [int]"""
    flat = bits(t.detach())                                                          # [N] int view
    total = 0
    for start in range(0, flat.numel(), _CHUNK):
        part = flat[start:start + _CHUNK].to(torch.int64)                             # [C]
        pos = torch.arange(offset + start, offset + start + part.numel(), device=part.device, dtype=torch.int64)
        weight = ((pos * 0x9E3779B1 + 0x7F4A7C15) % 2147483647) * 2 + 1              # [C] odd, < 2^32
        total += int((part * weight).sum())                                          # wraps in int64: exact mod 2^64
    return _signed(total)


def layout_fingerprints(held: dict[str, torch.Tensor], layout: list) -> dict[str, int]:
    """The fingerprint each engine tensor should have, from the learner's tensors by their Hugging
    Face names: `layout` is [(engine name, [source names in order], rows)], the sources stacked
    along dim 0 (vLLM's fused qkv and gate_up)."""
    out = {}
    for name, sources, _rows in layout:
        total, offset = 0, 0
        for src in sources:
            t = held[src]
            total += bit_fingerprint(t, offset)
            offset += t.numel()
        out[name] = _signed(total)
    return out
