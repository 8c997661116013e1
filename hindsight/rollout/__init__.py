"""Rollout.

The generation engines (hf, vllm), evaluation's greedy generation, and the rollout worker that
samples groups.
"""
