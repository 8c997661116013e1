"""vLLM: buckets of (name, CPU tensor) pairs pushed into a resident engine by the name of the
method hindsight adds to vLLM's worker (`rollout.engines.vllm_weights`), through
`LLM.collective_rpc`; vLLM's own serializer carries the tensors across its process boundary.
The engine acks each bucket with the number of tensors it loaded."""
from __future__ import annotations

import torch

from hindsight.buckets import by_size
from hindsight.errors import StageError
from hindsight.transport.base import WeightSender


class VLLMSender(WeightSender):
    def __init__(self, llm, bucket_bytes: int, weights_of):
        """`weights_of(model)`: the (name, tensor) pairs the engine loads (a LoRA policy's merged weights)."""
        self.llm, self.bucket_bytes, self.weights_of = llm, bucket_bytes, weights_of

    def publish(self, version: int, model) -> dict[str, float]:
        sent = 0
        for bucket in weight_buckets(self.weights_of(model), self.bucket_bytes):
            loaded = self.llm.collective_rpc("hindsight_load_weights", args=(bucket,))
            if any(n != len(bucket) for n in loaded):
                raise StageError(f"vLLM loaded {loaded} of {len(bucket)} tensors of weights version {version}")
            sent += sum(t.numel() * t.element_size() for _, t in bucket)
        self.llm.reset_prefix_cache()
        return {"publish/bytes": float(sent)}


def weight_buckets(weights: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """(name, tensor) pairs as CPU tensors in buckets of about `bucket_bytes` (`buckets.by_size`),
    the arguments of one `collective_rpc` each."""
    return [[(name, w.detach().to("cpu").contiguous()) for name, w in bucket] for bucket in by_size(weights, bucket_bytes)]
