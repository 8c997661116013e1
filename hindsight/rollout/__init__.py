"""Rollout.

The generation engines (hf: the batched sampler, also evaluation's greedy decoding; vllm), the
decoding contract both follow (`decoding`: end tokens, what the checkpoint may not set), and the
rollout worker that samples groups.
"""
