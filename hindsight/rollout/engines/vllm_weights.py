"""What vLLM's worker learns from hindsight (`worker_extension_cls`): one method that loads
named weights into the engine's model, so the RL stage can push weights by the method's name
through `LLM.collective_rpc` into an engine in another process. It runs inside vLLM's worker
(`self` is that worker) and imports nothing of vLLM itself."""
from __future__ import annotations


class WeightReceiver:
    def hindsight_load_weights(self, weights: list) -> int:
        """weights: (Hugging Face name, CPU tensor) pairs; the model maps names to its own layout."""
        model = self.model_runner.model
        model.load_weights([(name, w.to(self.device)) for name, w in weights])
        return len(weights)
