"""Hard-example replay and dynamic sampling: choosing which groups a batch trains on.

Both work on stored shards only, so a resumed run makes exactly the same choices.
"""
from __future__ import annotations

import json
import math

from hindsight.learning.algorithms.advantages import has_signal


def group_priority(rewards: list[float], seq_logprobs: list[float], priority: str) -> float:
    """How much a prompt still has to teach, from one stored group of completions.

    reward_std: the spread of its rewards (the policy is unsure of the answer).
    disagreement: minus the correlation between log-probability and reward (the policy is
    most confident in its worst completions).
    """
    n = len(rewards)
    mean_r = sum(rewards) / n
    std_r = math.sqrt(sum((r - mean_r) ** 2 for r in rewards) / n)
    if priority == "reward_std":
        return std_r
    mean_l = sum(seq_logprobs) / n
    std_l = math.sqrt(sum((x - mean_l) ** 2 for x in seq_logprobs) / n)
    if std_r < 1e-12 or std_l < 1e-12:
        return 0.0
    cov = sum((r - mean_r) * (x - mean_l) for r, x in zip(rewards, seq_logprobs)) / n
    return -cov / (std_r * std_l)


def pick_hard_examples(shards: list[tuple[list[dict], list[dict]]], k: int, priority: str,
                       exclude: set[str]) -> list[dict]:
    """The k highest-priority prompts across stored (rollouts, scores) shards, newest first on ties.

    Returns source rows ({'prompt', 'id', ...columns}) ready to be sampled again.
    """
    candidates: dict[str, tuple[float, int, dict]] = {}
    for rollouts, scores in shards:
        groups: dict[int, list[int]] = {}
        for j, r in enumerate(rollouts):
            groups.setdefault(r["group"], []).append(j)
        for members in groups.values():
            first = rollouts[members[0]]
            pid = first["prompt_id"]
            if pid in exclude:
                continue
            score = group_priority([scores[j]["reward"] for j in members],
                                   [sum(rollouts[j]["logprobs"]) for j in members], priority)
            row = {**json.loads(first["columns"]), "prompt": first["prompt"], "id": pid}
            if pid not in candidates or first["step"] > candidates[pid][1]:
                candidates[pid] = (score, first["step"], row)
    ranked = sorted(candidates.items(), key=lambda kv: (-kv[1][0], -kv[1][1], kv[0]))
    return [row for _, (score, _, row) in ranked[:k] if score > 0]


def signal_groups(rewards: list[float], group_size: int, wanted: int) -> tuple[list[int], int]:
    """Dynamic sampling (DAPO): the first `wanted` groups whose rewards differ.

    rewards: one per completion, groups contiguous. Returns (kept group indices, dropped count).
    """
    kept, dropped = [], 0
    for g in range(len(rewards) // group_size):
        group = rewards[g * group_size:(g + 1) * group_size]
        if not has_signal(group):
            dropped += 1
        elif len(kept) < wanted:
            kept.append(g)
    return kept, dropped
