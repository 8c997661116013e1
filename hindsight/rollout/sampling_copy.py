"""A lower-precision copy of the policy to sample from (`rl.rollout.hf.dtype: bfloat16`).

Decoding reads every weight once a position, so half the bytes a weight is the cheaper loop on
hardware where bandwidth binds (a GPU), and on a CPU with bf16 matrix units (AMX, avx512_bf16)
the matmuls themselves run faster. The learner keeps its float32 weights; the copy only samples.
Its tokens come from a slightly different policy, so its log-probs are the engine's side of the
off-policy correction (`learning.correction`) and the learner's float32 forward is the anchor.

The copy never outlives a sampling call (`SamplingCopy.sampling`): it is built from the policy's
current weights, used, and dropped, so in a sync run it is never alive beside the update's
gradients and activations, and it can never serve a stale weights version. Building it costs a
cast of every weight (a fraction of a second for 135 M parameters).

On a CPU whose oneDNN does bf16, each linear layer's weight is prepacked into oneDNN's blocked
layout once a build (`PackedLinear`): the decode's 16-row matmuls then skip the per-call reorder
(1.5-2x on SmolLM2's layers here, bench/decode_bound.py), with the same numbers as F.linear.
Anywhere else (a GPU, another CPU) the copy is a plain cast.
"""
from __future__ import annotations

import copy
import logging
from contextlib import contextmanager

import torch

log = logging.getLogger(__name__)
DTYPES = {"bfloat16": torch.bfloat16}
DECODE_ROWS = 16


class PackedLinear(torch.nn.Module):
    """A linear layer whose weight is held in oneDNN's prepacked layout (CPU only), in `dtype`
    (bf16 here; float32 for the policy's own decode, `rollout.prepacked`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        # the batch-size hint only picks oneDNN's blocking, not the numbers (the same bits at 1, 16
        # and 128 here); a decode's rows are what it serves most
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), DECODE_ROWS)
        self.bias_bf16 = None if bias is None else bias.detach().to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:                      # (..., in) -> (..., out)
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.packed, self.bias_bf16, "none", [], "")


def packs_linears(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether PackedLinear runs here and gives F.linear's numbers (checked once on a small
    layer): bf16 on a CPU whose oneDNN supports it."""
    if dtype is not torch.bfloat16 or device.type != "cpu":
        return False
    global _PACKS
    if _PACKS is None:
        try:
            if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
                _PACKS = False
            else:
                w, x = torch.randn(24, 16).bfloat16(), torch.randn(4, 16).bfloat16()
                _PACKS = torch.allclose(PackedLinear(w, None)(x).float(), torch.nn.functional.linear(x, w).float(),
                                        rtol=1e-2, atol=1e-2)
        except (RuntimeError, AttributeError):  # an op this build of torch lacks
            _PACKS = False
    return _PACKS


_PACKS: bool | None = None


def build_copy(policy, dtype: torch.dtype):
    """A copy of `policy` in `dtype` for inference: the same modules, every parameter cast (tied
    weights stay tied), buffers as they are (a rotary table keeps its float32), and each linear
    layer prepacked where `packs_linears`. Never more than one float32 tensor's worth of extra
    memory while it is built: parameters are cast one by one through deepcopy's memo."""
    device = next(policy.parameters()).device
    pack = packs_linears(dtype, device)
    linears = {id(m.weight) for m in policy.modules() if isinstance(m, torch.nn.Linear)} if pack else set()
    # a linear weight another module reads too (a tied input embedding) keeps a real cast
    shared = {id(q) for m in policy.modules() if not isinstance(m, torch.nn.Linear) for q in m.parameters(recurse=False)}
    memo = {}
    for p in policy.parameters():
        if id(p) in memo:
            continue
        if id(p) in linears and id(p) not in shared:
            memo[id(p)] = torch.nn.Parameter(torch.empty(0, dtype=dtype, device=device), requires_grad=False)
        else:
            memo[id(p)] = torch.nn.Parameter(p.detach().to(dtype), requires_grad=False)
    out = copy.deepcopy(policy, memo)
    if pack:
        sources = dict(policy.named_modules())
        for name, module in list(out.named_modules()):
            for child_name, child in list(module.named_children()):
                if isinstance(child, torch.nn.Linear):
                    src = sources[f"{name}.{child_name}" if name else child_name]
                    setattr(module, child_name, PackedLinear(src.weight, src.bias))
    return out.eval()


class SamplingCopy:
    """What the hf engine samples with when `rl.rollout.hf.dtype` names a dtype."""

    def __init__(self, dtype: str):
        self.dtype = DTYPES[dtype]
        self.warned = False

    @contextmanager
    def sampling(self, policy):
        """The copy of `policy`'s current weights, for one sampling call; freed afterwards."""
        self.warn_if_slow(next(policy.parameters()).device)
        model = build_copy(policy, self.dtype)
        try:
            yield model
        finally:
            del model

    def warn_if_slow(self, device: torch.device) -> None:
        """Once: a CPU without bf16 matrix units (AVX2 only) emulates bf16 matmuls, and the copy
        then decodes slower than float32 (0.46x on SmolLM2 on an AVX2 EPYC, docs/benchmarks.md)."""
        if self.warned or device.type != "cpu" or packs_linears(self.dtype, device):
            return
        self.warned = True
        log.warning("rl.rollout.hf.dtype: bfloat16 on a CPU without bf16 matrix support (%s, no oneDNN bf16): "
                    "bf16 matmuls are emulated here and the copy samples slower than float32; leave "
                    "rl.rollout.hf.dtype unset on this machine", torch.backends.cpu.get_cpu_capability())
