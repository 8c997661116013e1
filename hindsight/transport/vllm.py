"""vLLM: weights pushed into a resident engine by the names of the methods hindsight adds to
vLLM's worker (`rollout.engines.vllm_weights`), through `LLM.collective_rpc`; vLLM's own
serializer carries the tensors across its process boundary.

The first version, every `full_every`-th and any the engine refused go whole, a bucket of
(name, CPU tensor) pairs at a time, each with its checksum and acked with the number of tensors
loaded; the engine then holds that version. Every other version is a delta against it
(`transport.delta`): only the elements whose bits changed in the serving dtype, in one call. The
engine checks its checksum and base version; a refusal is answered with the full copy at once,
before anything is sampled, so the engine never serves mixed weights."""
from __future__ import annotations

import torch

from hindsight.buckets import by_size
from hindsight.errors import StageError
from hindsight.transport.base import WeightSender
from hindsight.transport.delta import Publication
from hindsight.transport.payload import WeightVersion, checksum


class VLLMSender(WeightSender):
    def __init__(self, llm, bucket_bytes: int, weights_of, publication: Publication | None = None):
        """`weights_of(model)`: the (name, tensor) pairs the engine loads (a LoRA policy's merged
        weights); `publication` in the engine's dtype (what a delta is taken in)."""
        self.llm, self.bucket_bytes, self.weights_of = llm, bucket_bytes, weights_of
        self.publication = publication or Publication()

    def publish(self, version: int, model) -> dict[str, float]:
        payload = self.publication.next(version, dict(self.weights_of(model)))
        sent, refused = payload.nbytes, 0
        if payload.base is None:
            self._send_full(payload)
        else:
            why = [w for w in self.llm.collective_rpc("hindsight_apply_delta", args=(
                payload.version, payload.base, payload.sha256, payload.tensors)) if w]
            if why:  # a torn delta, or an engine that missed a version: the full copy, now
                full = self.publication.full()
                self._send_full(full)
                sent, refused = sent + full.nbytes, len(why)
        self.llm.reset_prefix_cache()
        return {"publish/bytes": float(sent), "publish/delta": float(payload.base is not None),
                "publish/resent_full": float(refused)}

    def _send_full(self, payload: WeightVersion) -> None:
        for bucket in weight_buckets(list(payload.tensors.items()), self.bucket_bytes):
            loaded = self.llm.collective_rpc("hindsight_load_weights", args=(bucket, checksum(dict(bucket))))
            if any(n != len(bucket) for n in loaded):
                raise StageError(f"vLLM loaded {loaded} of {len(bucket)} tensors of weights version {payload.version}"
                                 " (-1: the bucket failed its checksum)")
        self.llm.collective_rpc("hindsight_hold_version", args=(payload.version,))

    def close(self) -> None:
        self.publication.held = None


def weight_buckets(weights: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """(name, tensor) pairs as CPU tensors in buckets of about `bucket_bytes` (`buckets.by_size`),
    the arguments of one `collective_rpc` each."""
    return [[(name, w.detach().to("cpu").contiguous()) for name, w in bucket] for bucket in by_size(weights, bucket_bytes)]
