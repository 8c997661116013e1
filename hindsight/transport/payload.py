"""What moves: a weights version. A payload carries the tensors (detached CPU copies) with a
checksum over their names, dtypes, shapes and bytes, or, in process, the model object itself.
A receiver checks the checksum before it loads anything, so a flipped bit or a torn message is
refused (`CorruptWeights`), never trained on."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


class CorruptWeights(ValueError):
    """A payload whose tensors do not match its checksum."""


@dataclass(frozen=True)
class WeightVersion:
    version: int
    tensors: dict[str, torch.Tensor] | None = None  # name -> tensor; None when `shared`
    sha256: str | None = None
    shared: object | None = None                     # in process: the sender's model itself
    base: int | None = None                          # a delta: the version it applies to (`delta`)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.tensors or {}).values())


def checksum(tensors: dict[str, torch.Tensor], version: int | None = None, base: int | None = None) -> str:
    """sha256 over the header (the version and, for a delta, the version it applies to) and each
    tensor's name, dtype, shape and bytes, in name order: a flipped version or base is refused
    like a flipped weight. A bucket of a full copy has no header of its own (version None)."""
    h = hashlib.sha256()
    if version is not None:
        h.update(f"version={version}|base={base}|".encode())
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def full_version(version: int, state: dict[str, torch.Tensor]) -> WeightVersion:
    """Every tensor of `state`, copied to the CPU (a clone: tied weights share memory, and the
    sender goes on training its own)."""
    tensors = {k: v.detach().to("cpu").clone() for k, v in state.items()}
    return WeightVersion(version, tensors, checksum(tensors, version))


def verified(payload: WeightVersion) -> dict[str, torch.Tensor]:
    """The payload's tensors, once they match its checksum."""
    if payload.tensors is None:
        raise CorruptWeights(f"weights version {payload.version} carries no tensors")
    got = checksum(payload.tensors, payload.version, payload.base)
    if got != payload.sha256:
        raise CorruptWeights(f"weights version {payload.version}: checksum {got[:12]}… does not match the "
                             f"{str(payload.sha256)[:12]}… it was sent with: refused")
    return payload.tensors


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    """name -> tensor as safetensors bytes (what crosses a pipe or vLLM's RPC); no pickle."""
    from safetensors.torch import save

    return save({name: t.contiguous() for name, t in tensors.items()})


def bytes_tensors(data: bytes, version=None) -> dict[str, torch.Tensor]:
    """`tensor_bytes`' inverse; torn or garbled bytes raise `CorruptWeights`."""
    from safetensors.torch import load

    try:
        return load(bytes(data))
    except Exception as exc:  # a torn or garbled message: the checksum cannot even be computed
        raise CorruptWeights(f"weights version {version}: unreadable ({type(exc).__name__})") from None


def to_bytes(payload: WeightVersion) -> tuple[dict, bytes]:
    """(a JSON header, safetensors bytes) for a byte stream; no pickle."""
    return {"version": payload.version, "sha256": payload.sha256, "base": payload.base}, tensor_bytes(payload.tensors)


def from_bytes(header: dict, data: bytes) -> WeightVersion:
    tensors = bytes_tensors(data, header.get("version"))
    base = header.get("base")
    return WeightVersion(int(header["version"]), tensors, header.get("sha256"), base=None if base is None else int(base))
