"""A sharded rank's start: the model is built on the meta device (no weights in memory),
sharded, given empty storage for its own shard only, and filled from the checkpoint's
safetensors a slice at a time, each rank reading only its rows (safetensors reads a slice
through mmap without the rest). Host memory at start is then about 1/P of the model plus one
tensor, where a full build before sharding holds the whole model on every rank.

What a meta build loses is put back: tied weights are tied again before sharding (accelerate's
empty init makes each one a parameter of its own), and non-persistent buffers (rotary
frequencies), which are computed in the constructor and are in no checkpoint, are built for
real on the CPU and copied back after the storage is allocated. A parameter that no checkpoint
file holds is either a fresh head (`fresh`, the same values whatever the strategy) or an error.
"""
from __future__ import annotations

from pathlib import Path

import torch

from hindsight.errors import CheckpointError
from hindsight.models.load import weight_files


def can_start_on_meta(path: str) -> bool:
    """A plain model folder with safetensors (not an adapter, not a hub id not yet downloaded)."""
    folder = Path(path)
    return folder.is_dir() and not (folder / "adapter_config.json").exists() and bool(weight_files(folder))


def materialize(model, path: str, device: torch.device, fresh: dict[str, torch.Tensor], tensors) -> None:
    """Give the sharded meta `model` storage on `device` and fill this rank's slices from the
    checkpoint at `path`; `fresh` holds the full values of tensors no file has; `tensors(model)`
    lists the tensors to fill by their state-dict names (tied ones once)."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers() if not b.is_meta}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in buffers:  # computed in the constructor: the same on every rank
                b.copy_(buffers[name])
        files = weight_files(path)
        missing = [name for name, _ in tensors(model) if name not in files and name not in fresh]
        if missing:
            raise CheckpointError(f"{path}: no safetensors file holds {', '.join(missing[:5])}: the folder does not "
                                  f"match the model its config builds")
        for name, t in tensors(model):
            _fill(t, name, fresh.get(name), files.get(name))


def _fill(t: torch.Tensor, name: str, full: torch.Tensor | None, file: Path | None) -> None:
    """Copy this rank's rows of tensor `name` into `t` (a DTensor shard, or a whole tensor). The
    file is opened for this tensor alone: its mapped pages are released before the next one, so
    a rank never holds more of the file than one tensor's slice."""
    local, rows = _local_rows(t)
    if local.numel() == 0:
        return
    if full is not None:
        local.copy_(full[rows].reshape(local.shape).to(local.dtype))
        return
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as f:
        part = f.get_tensor(name) if rows == slice(None) else f.get_slice(name)[rows.start:rows.stop]
        local.copy_(part.reshape(local.shape).to(local.dtype))
        del part


def _local_rows(t: torch.Tensor) -> tuple[torch.Tensor, slice]:
    """(the tensor's local storage, the rows of the full tensor it holds). FSDP2 shards on dim 0."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(t, DTensor):
        return t, slice(None)
    if len(t.placements) != 1 or not isinstance(t.placements[0], Shard) or t.placements[0].dim != 0:
        raise TypeError(f"a sharded tensor placed as {t.placements}: only dim-0 shards (FSDP2's) are read slice-wise")
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
    return t.to_local(), slice(offset[0], offset[0] + shape[0])
