"""Rollout.

The engine contract and its registry (`engines`: hf, vllm), the batched sampler (`hf`, also
evaluation's greedy decoding), the decoding contract every engine follows (`decoding`: end
tokens, what the checkpoint may not set), and the rollout worker that samples groups.
"""
