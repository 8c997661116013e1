"""`hf`: hindsight's batched sampler (`rollout.hf.sample_groups`) on the worker's own policy,
in its process, on a CPU or a GPU. It samples a batch of groups at once, one prefill per prompt.

Its own block, `rl.rollout.hf`:
- `dtype: policy` (the default): it samples the policy itself, and its behaviour log-probs are
  the training model's own forward, so nothing is recomputed and no correction is needed;
- `dtype: bfloat16`: it samples a bf16 copy of the policy (`rollout.sampling_copy`), built from
  the current weights for each sampling call and dropped after it; the copy's decoding log-probs
  are the engine's side of the off-policy correction, the learner's forward is the anchor;
- `prepack: true` (the default): on a CPU, the float32 decode runs its large linears prepacked
  for oneDNN (`rollout.prepacked`: 1.5x the decode steps a second on SmolLM2), packed for each
  sampling call and dropped after it; `false`: F.linear, and no packed copy of those weights
  while sampling.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from hindsight.rollout.engines.base import Engine, EngineSettings, register


class HFSettings(EngineSettings):
    dtype: Literal["policy", "bfloat16"] = Field(
        "policy", description="policy: sample the policy itself; bfloat16: sample a bf16 copy of it (half the bytes "
                              "a decode step reads; on a CPU with bf16 matrix units, faster matmuls; on one without, "
                              "emulated and slower, which it warns of), its gap to the float32 learner logged and "
                              "corrected (rl.learner.correction)")
    prepack: bool = Field(True, description="on a CPU, the float32 decode's large linears run prepacked for oneDNN, "
                                            "packed from the current weights for each sampling call (a copy of them "
                                            "while it samples): faster 16-row matmuls, F.linear's numbers to "
                                            "round-off; false: F.linear")


@register
class HF(Engine):
    name = "hf"
    Settings = HFSettings
    batches_groups = True
    recompute_logprobs = False
    multi_turn = True

    @classmethod
    def recomputes(cls, rollout) -> bool:
        return copy_dtype(rollout) is not None

    def __init__(self, ctx):
        super().__init__(ctx)
        self.policy = ctx.policy
        self.copy = None
        self.prepack = prepacks(ctx.rollout)
        dtype = copy_dtype(ctx.rollout)
        if dtype is not None:
            from hindsight.rollout.sampling_copy import SamplingCopy

            self.copy = SamplingCopy(dtype)

    def load_weights(self, policy) -> None:
        self.policy = policy  # the worker's model itself: nothing to copy (a sampling copy is made per call)

    def sample(self, prompts: list, seeds: list[int], group_size: int):
        from hindsight.rollout.hf import sample_groups  # torch: not at import (see engines/vllm.py)

        r = self.ctx.rollout
        if self.copy is None:  # `learner`: the decoding log-probs are kept for the gap, no forward is run
            return sample_groups(self.policy, self.ctx.tok, prompts, seeds, group_size, r.max_new_tokens,
                                 r.temperature, r.top_p, "decode" if r.logprobs == "learner" else r.logprobs,
                                 self.ctx.budget, prepack=self.prepack)
        with self.copy.sampling(self.policy) as model:  # the copy's own log-probs: the engine's side
            return sample_groups(model, self.ctx.tok, prompts, seeds, group_size, r.max_new_tokens, r.temperature,
                                 r.top_p, "decode", self.ctx.budget)

    def continue_turns(self, ids, mask, gens: list, max_new_tokens: int, temperature: float, top_p: float,
                       stop_ids) -> tuple:
        return model_turns(self.policy, self.ctx.tok.pad_token_id, self.prepack)(ids, mask, gens, max_new_tokens,
                                                                                  temperature, top_p, stop_ids)


def _block(rollout):
    """The rollout section's `hf` block where hf samples, else None."""
    return rollout.engine_settings("hf") if rollout.backend == "hf" else None


def copy_dtype(rollout) -> str | None:
    """The sampling copy's dtype the rollout section asks of hf, or None (the policy itself)."""
    block = _block(rollout)
    return None if block is None or block.dtype == "policy" else block.dtype


def prepacks(rollout) -> bool:
    """Whether hf's float32 decode prepacks its large linears (`rl.rollout.hf.prepack`, default on)."""
    block = _block(rollout)
    return block is None or block.prepack


def model_turns(model, pad_id: int, prepack: bool = True):
    """`continue_turns` on a plain model: what evaluation, which holds no engine, plays turns with."""
    def turns(ids, mask, gens: list, max_new_tokens: int, temperature: float, top_p: float, stop_ids) -> tuple:
        from hindsight.rollout.hf import decode

        out, cmask, _ = decode(model, ids, mask, gens, 1, max_new_tokens, temperature, top_p, stop_ids, pad_id,
                               prepack=prepack)
        return out, cmask                                                            # (N, T') each
    return turns
