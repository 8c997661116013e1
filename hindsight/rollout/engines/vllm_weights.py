"""What vLLM's worker learns from hindsight (`worker_extension_cls`): methods that load named
weights into the engine's model, so the RL stage can push weights by the methods' names through
`LLM.collective_rpc` into an engine in another process. They run inside vLLM's worker (`self` is
that worker) and import nothing of vLLM itself.

A full copy arrives a bucket at a time, each with its checksum; the worker keeps what it loaded
under the Hugging Face names (CPU, the serving dtype) and, once every bucket is in, the version
(`hindsight_hold_version`). A delta (`transport.delta`) then needs only the elements that
changed: the worker checks its checksum and base version, writes the changes into its copy and
loads the tensors they touched. vLLM's own layout (fused qkv, tensor-parallel shards) is left to
its `load_weights`, which takes whole tensors by their Hugging Face names.
"""
from __future__ import annotations


class _Held:
    """The worker's copy as `apply_delta` reads a model: by its state dict."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def state_dict(self) -> dict:
        return self.tensors


class WeightReceiver:
    def hindsight_dtype(self) -> str:
        """The dtype the engine's model holds its weights in ("bfloat16")."""
        return str(next(self.model_runner.model.parameters()).dtype).removeprefix("torch.")

    def hindsight_load_weights(self, weights: list, sha256: str | None = None) -> int:
        """weights: (Hugging Face name, CPU tensor) pairs, one bucket; returns how many were loaded,
        -1 for a bucket that fails its checksum (nothing of it is loaded)."""
        from hindsight.transport.payload import checksum

        if sha256 is not None and checksum(dict(weights)) != sha256:
            return -1
        model = self.model_runner.model
        model.load_weights([(name, w.to(self.device)) for name, w in weights])
        held = self.__dict__.setdefault("_hindsight_held", {})
        held.update({name: w.clone() for name, w in weights})
        self._hindsight_version = None  # a full copy in progress: no delta applies until it is sealed
        return len(weights)

    def hindsight_hold_version(self, version: int) -> int:
        """Every bucket of `version`'s full copy is loaded: deltas from it may follow."""
        self._hindsight_version = version
        return version

    def hindsight_apply_delta(self, version: int, base: int, sha256: str, tensors: dict) -> str:
        """A delta from `base` to `version`; returns "" once applied, else why it was refused
        (then nothing of it is loaded and the sender sends the full copy)."""
        from hindsight.transport.delta import MalformedDelta, apply_delta
        from hindsight.transport.payload import CorruptWeights, WeightVersion, verified

        holds = getattr(self, "_hindsight_version", None)
        if holds != base:
            return f"a delta from version {base}, but this engine holds version {holds}: it needs a full copy"
        try:
            verified(WeightVersion(version, tensors, sha256, base=base))
        except CorruptWeights as exc:
            return str(exc)
        held = self._hindsight_held
        try:
            apply_delta(_Held(held), tensors)
        except MalformedDelta as exc:
            return str(exc)
        changed = sorted({key.rsplit("::", 1)[0] for key in tensors})
        self.model_runner.model.load_weights([(name, held[name].to(self.device)) for name in changed])
        self._hindsight_version = version
        return ""
