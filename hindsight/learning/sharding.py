"""FSDP2 for the learner group (`rl.workers.learner_strategy: fsdp2`): each rank keeps 1/P of the
weights, gradients and Adam state, so a model too big for one device trains over several.

What differs from a replicated learner, and why each piece is here:
- `shard`: one FSDP unit per decoder layer (the model's own `_no_split_modules`), then the root,
  so a forward holds one layer's full weights at a time; bf16/fp16 compute all-gathers the
  weights in that dtype while the optimizer keeps fp32 masters (`MixedPrecisionPolicy`).
- every rank must issue the same collectives in the same order: `full_buckets` gathers the full
  weights a bucket at a time on all ranks at once (only the receiver keeps them), and
  `save_state`/`load_state` are `torch.distributed.checkpoint` calls that all ranks make.
- FSDP2 averages gradients over the ranks (gloo has no pre-multiplied sum), so a rank's loss is
  multiplied by the world size (`update.Share.grad_scale`) to keep the sum of the ranks' parts.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from hindsight.buckets import by_size, nbytes


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard(model, offload: bool = False, compute_dtype: torch.dtype = torch.float32):
    """Shard `model` in place over the default process group and return it.

    offload: parameters, gradients and optimizer state live on the CPU between uses
    (`CPUOffloadPolicy`); the step runs there, the forwards on the device.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs = {}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    if compute_dtype != torch.float32:  # the masters stay fp32; gradients are reduced in fp32
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def decoder_layers(model) -> list[torch.nn.Module]:
    """The modules a model's authors say must not be split (its decoder layers), outermost first."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names and hasattr(model, "get_base_model"):
        names = set(model.get_base_model()._no_split_modules or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise TypeError(f"{type(model).__name__}: no decoder layers to shard (its _no_split_modules is empty)")
    return layers


def tensors(model) -> list[tuple[str, torch.Tensor]]:
    """Parameters (tied ones once) and persistent buffers, by their state-dict names."""
    persistent = set(model.state_dict(keep_vars=True))
    return [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if n in persistent)]


def aliases(model) -> dict[str, str]:
    """State-dict names that are another tensor's (tied weights: lm_head -> embed_tokens)."""
    canonical = {id(t): n for n, t in tensors(model)}
    return {n: canonical[id(t)] for n, t in model.state_dict(keep_vars=True).items()
            if id(t) in canonical and canonical[id(t)] != n}


def full_buckets(model, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """The model's full weights, a bucket of about `bucket_bytes` at a time (one tensor larger
    than a bucket is a bucket of its own). Every rank must iterate it in step: each tensor is
    all-gathered from the shards. A bucket is dropped by the caller before the next is
    gathered, so a rank holds at most one bucket of gathered weights, plus the all-gather's own
    buffer for the tensor in flight (tests/roles/test_publish_memory.py measures it)."""
    from torch.distributed.tensor import DTensor

    for bucket in by_size(tensors(model), bucket_bytes):  # cut by the DTensors' global sizes
        yield {name: (t.full_tensor() if isinstance(t, DTensor) else t).detach() for name, t in bucket}


def copy_into(receiver, bucket: dict[str, torch.Tensor], targets: dict[str, torch.Tensor] | None = None) -> None:
    """Copy a bucket of full weights into the same-named tensors of a full model, in place."""
    targets = targets if targets is not None else dict(tensors(receiver))
    with torch.no_grad():
        for name, value in bucket.items():
            if name not in targets:
                raise KeyError(f"{type(receiver).__name__} has no tensor {name}: the learner and the rollout model "
                               f"are not the same architecture")
            targets[name].copy_(value)


def publish(model, receiver, bucket_bytes: int) -> dict[str, float]:
    """Gather the sharded `model` into the full `receiver` a bucket at a time (every rank calls
    it; `receiver` is None on ranks that only take part in the gathers)."""
    targets = dict(tensors(receiver)) if receiver is not None else None
    buckets = largest = 0
    for bucket in full_buckets(model, bucket_bytes):
        if receiver is not None:
            copy_into(receiver, bucket, targets)
        buckets += 1
        largest = max(largest, sum(nbytes(t) for t in bucket.values()))
        del bucket
    return {"publish/buckets": float(buckets), "publish/largest_bucket_mb": largest / 2**20}


def state_parts(parts: dict[str, tuple]) -> dict:
    """The sharded state of each (model, optimizer) pair, as DCP saves and loads it."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out = {}
    for name, (model, optimizer) in parts.items():
        out[f"{name}/model"], out[f"{name}/optimizer"] = get_state_dict(model, optimizer)
    return out


def save_state(folder: Path, parts: dict[str, tuple]) -> None:
    """Every rank writes its shard of each part into `folder` (one file per rank and `.metadata`)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(state_parts(parts), checkpoint_id=str(folder))


def load_state(folder: Path, parts: dict[str, tuple]) -> None:
    """Every rank reads its shard of each part back from `folder` (any world size can read it)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = state_parts(parts)
    dcp.load(state, checkpoint_id=str(folder))
    for name, (model, optimizer) in parts.items():
        set_state_dict(model, optimizer, model_state_dict=state[f"{name}/model"],
                       optim_state_dict=state[f"{name}/optimizer"])
