"""`hf`: hindsight's batched sampler (`rollout.hf.sample_groups`) on the worker's own policy,
in its process, on a CPU or a GPU. It samples a batch of groups at once, one prefill per prompt,
and its behaviour log-probs are the training model's own forward, so nothing is recomputed."""
from __future__ import annotations

from hindsight.rollout.engines.base import Engine, register


@register
class HF(Engine):
    name = "hf"
    batches_groups = True
    recompute_logprobs = False
    multi_turn = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self.policy = ctx.policy

    def load_weights(self, policy) -> None:
        self.policy = policy  # the worker's model itself: nothing to copy

    def sample(self, prompts: list, seeds: list[int], group_size: int):
        from hindsight.rollout.hf import sample_groups  # torch: not at import (see engines/vllm.py)

        r = self.ctx.rollout
        return sample_groups(self.policy, self.ctx.tok, prompts, seeds, group_size, r.max_new_tokens, r.temperature,
                             r.top_p, r.logprobs, self.ctx.budget)

    def continue_turns(self, ids, mask, gens: list, max_new_tokens: int, temperature: float, top_p: float,
                       stop_ids) -> tuple:
        return model_turns(self.policy, self.ctx.tok.pad_token_id)(ids, mask, gens, max_new_tokens, temperature,
                                                                    top_p, stop_ids)


def model_turns(model, pad_id: int):
    """`continue_turns` on a plain model: what evaluation, which holds no engine, plays turns with."""
    def turns(ids, mask, gens: list, max_new_tokens: int, temperature: float, top_p: float, stop_ids) -> tuple:
        from hindsight.rollout.hf import decode

        out, cmask, _ = decode(model, ids, mask, gens, 1, max_new_tokens, temperature, top_p, stop_ids, pad_id)
        return out, cmask                                                            # (N, T') each
    return turns
