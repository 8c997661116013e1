"""Held-out accuracy: greedy answers to eval prompts, judged by a reward function (score >= 1).

The judge goes through the same guarded scoring as training rewards (`score_completions`):
TRL's keyword contract, a timeout in the reward worker, and the fallback when it fails.
"""
from __future__ import annotations

import torch

from hindsight.rollout.greedy import generate
from hindsight.scoring.rewards import score_completions


@torch.no_grad()
def greedy_answers(model, tok, prompts: list[str], max_new_tokens: int,
                   batch_size: int = 64) -> tuple[list[str], list[list[int]]]:
    """(answer texts, their token ids) for each prompt."""
    texts: list[str] = []
    ids: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        exp = generate(model, tok, prompts[i:i + batch_size], 1, max_new_tokens, do_sample=False)
        texts.extend(tok.batch_decode(exp.completion_ids, skip_special_tokens=True))
        ids.extend(row[m.bool()].tolist() for row, m in zip(exp.completion_ids, exp.completion_mask))
    return texts, ids


def judge(model, tok, rows: list[dict], reward_spec: str, max_new_tokens: int, worker=None,
          timeout_s: float = 60.0, fallback: float = 0.0) -> list[tuple[str, bool]]:
    """Greedy answer and its correctness for each row: the cells of a version comparison."""
    prompts = [r["prompt"] for r in rows]
    answers, ids = greedy_answers(model, tok, prompts, max_new_tokens)
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
    result = score_completions([(reward_spec, 1.0)], answers, columns, fallback, worker, timeout_s,
                               prompts=prompts, completion_ids=ids)
    return [(a, s >= 1.0) for a, s in zip(answers, result.total)]


def accuracy(model, tok, rows: list[dict], reward_spec: str, max_new_tokens: int, worker=None,
             timeout_s: float = 60.0, fallback: float = 0.0) -> tuple[float, list[str]]:
    judged = judge(model, tok, rows, reward_spec, max_new_tokens, worker, timeout_s, fallback)
    return sum(1.0 for _, ok in judged if ok) / len(rows), [a for a, _ in judged]
