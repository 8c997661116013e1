"""Held-out accuracy: greedy answers to eval prompts, judged by a reward function (score >= 1)."""
from __future__ import annotations

import torch

from hindsight.rollout.hf import decode_completions, generate
from hindsight.scoring import load_reward_fn


@torch.no_grad()
def greedy_answers(model, tok, prompts: list[str], max_new_tokens: int, batch_size: int = 64) -> list[str]:
    out: list[str] = []
    for i in range(0, len(prompts), batch_size):
        exp = generate(model, tok, prompts[i:i + batch_size], 1, max_new_tokens, do_sample=False)
        out.extend(decode_completions(tok, exp))
    return out


def accuracy(model, tok, rows: list[dict], reward_spec: str, max_new_tokens: int) -> tuple[float, list[str]]:
    answers = greedy_answers(model, tok, [r["prompt"] for r in rows], max_new_tokens)
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
    scores = load_reward_fn(reward_spec)(answers, **columns)
    return sum(1.0 for s in scores if s >= 1.0) / len(rows), answers


def judge(model, tok, rows: list[dict], reward_spec: str, max_new_tokens: int) -> list[tuple[str, bool]]:
    """Greedy answer and its correctness for each row: the cells of a version comparison."""
    answers = greedy_answers(model, tok, [r["prompt"] for r in rows], max_new_tokens)
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k != "prompt"}
    scores = load_reward_fn(reward_spec)(answers, **columns)
    return [(a, s >= 1.0) for a, s in zip(answers, scores)]
