"""A test's worker extension: hindsight's weight receiver, plus a way to read back what the
engine's model holds (vLLM's worker has no such method; a test needs one to compare bits)."""
from hindsight.rollout.engines.vllm_weights import WeightReceiver


class ReadbackReceiver(WeightReceiver):
    def readback_state(self) -> dict:
        return {k: v.detach().clone() for k, v in self.model_runner.model.hf.state_dict().items()}
