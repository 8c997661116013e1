"""A test's worker extension for vLLM's own engine: hindsight's weight receiver, plus what a test
needs and vLLM's worker has no method for: the worker's copy of the weights to compare bits with,
and a way to change one engine tensor behind hindsight's back."""
from hindsight.rollout.engines.vllm_weights import WeightReceiver


class TestReceiver(WeightReceiver):
    def readback_held(self) -> bytes:
        """The worker's copy as safetensors bytes (a returned tensor would cross vLLM's RPC untyped)."""
        from hindsight.transport.payload import tensor_bytes

        return tensor_bytes(self._hindsight_held)

    def tamper(self, name: str) -> str:
        """Add 1 to the first element of the engine's parameter `name`."""
        import torch

        with torch.no_grad():
            dict(self.model_runner.model.named_parameters())[name].view(-1)[0] += 1
        return name
