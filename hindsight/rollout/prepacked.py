"""The policy's own float32 decode with its large linear layers prepacked for oneDNN.

A decode step multiplies 16 rows by every weight. On a CPU, `F.linear` hands that to MKL's
sgemm, which re-lays the weight out for its kernel on every call; oneDNN's prepacked matmul
does that once. On SmolLM2-135M's shapes at 16 rows (an AVX-512 EPYC, 2 threads) that is 1.4x
faster on the attention projections, 1.9x on the MLP's and 2.75x on the 49,152-row output
layer, and a whole decode step 1.5-1.7x faster (`bench/decode_bound.py`).

`prepacked_linears(model)` packs each large float32 linear's current weight for one decode call
and drops the packs after it: they are built from the weights of that moment, so they are never
stale, and they never sit beside the update's gradients and activations. Packing SmolLM2's 151
large linears takes 0.13-0.27 s, against ~30-50 ms saved a decoded position.

The numbers are oneDNN's float32 matmul's, equal to F.linear's to float32 round-off, not bit for
bit. The learner's log-probs (the ratio's anchor) still come from the plain forward; the decode's
own log-probs (`rollout.logprobs: learner`) differ from it by that round-off, which the gap
metrics show. A decode stays bit-reproducible for a seed (oneDNN is deterministic for a shape
and thread count). Anywhere else (a GPU, autocast, gradients on, a sharded or small weight)
a linear runs as it is.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from hindsight.rollout.sampling_copy import PackedLinear

# weights smaller than this (elements) run as they are: packing gains nothing on them (a
# 192 x 576 projection ran alike both ways) and the tiny test models stay on F.linear
MIN_ELEMENTS = 1 << 18
_WORKS: bool | None = None  # whether oneDNN's float32 prepacked matmul runs here, checked once


def works_here() -> bool:
    """Whether oneDNN's prepacked float32 matmul runs on this CPU and gives F.linear's numbers
    (to float32 round-off, checked once on a small layer)."""
    global _WORKS
    if _WORKS is None:
        try:
            w, x = torch.randn(40, 24), torch.randn(5, 24)
            _WORKS = bool(torch.backends.mkldnn.is_available()) and torch.allclose(
                PackedLinear(w, None, torch.float32)(x), torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-5)
        except (RuntimeError, AttributeError):  # an op this build of torch lacks
            _WORKS = False
    return _WORKS


def packable(module: torch.nn.Module) -> bool:
    """A plain float32 CPU linear large enough to gain from packing (not a DTensor shard, not
    on the meta device, not a subclass such as a quantized or LoRA layer, and not one whose
    forward something else has already replaced, such as an offloading hook)."""
    if type(module) is not torch.nn.Linear or "forward" in module.__dict__:
        return False
    w = module.weight
    return (type(w.data) is torch.Tensor and w.dtype == torch.float32 and w.device.type == "cpu"
            and w.numel() >= MIN_ELEMENTS)


@contextmanager
def prepacked_linears(model):
    """Within: each packable linear of `model` runs its current weight prepacked, while no
    gradient is recorded and no autocast is on (else as it is). After: the packs are dropped and
    the modules are as they were."""
    targets = [m for m in model.modules() if packable(m)]
    if not targets or not works_here():
        yield model
        return
    for m in targets:
        m.forward = _packed_forward(m, PackedLinear(m.weight, m.bias, torch.float32))  # shadows the class's
    try:
        yield model
    finally:
        for m in targets:
            del m.forward


def _packed_forward(module: torch.nn.Linear, packed: PackedLinear):
    plain = type(module).forward.__get__(module)

    def forward(x: torch.Tensor) -> torch.Tensor:                              # (..., in) -> (..., out)
        if torch.is_grad_enabled() or torch.is_autocast_enabled(x.device.type) or x.dtype != torch.float32:
            return plain(x)
        return packed(x)
    return forward
