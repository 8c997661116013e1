"""The negative-sample stage: after RL, a short fine-tune that makes the policy's worst stored
completions less likely (unlikelihood) while keeping its best ones likely (NLL).

It reads only the rollout store, so it costs no generation: the look-back in action.
"""
from __future__ import annotations

import random

import torch

from hindsight.learning.terms import unlikelihood_loss
from hindsight.maths.experience import pad_left, pad_right
from hindsight.maths.logprobs import token_logprobs
from hindsight.state.store import RolloutStore


def split_by_reward(store: RolloutStore, quantile: float) -> tuple[list[dict], list[dict]]:
    """(negatives, positives): completions in the lowest `quantile` of stored rewards that
    scored below the best, and those that scored the best."""
    rows = []
    for step in store.steps("scores"):
        if store.has("rollouts", step):
            rows += [{**r, "reward": s["reward"]}
                     for r, s in zip(store.read("rollouts", step), store.read("scores", step))]
    rows = [r for r in rows if r["completion_ids"]]
    if not rows:
        return [], []
    rewards = sorted(r["reward"] for r in rows)
    cut = rewards[min(len(rewards) - 1, int(quantile * len(rewards)))]
    best = rewards[-1]
    return [r for r in rows if r["reward"] <= cut and r["reward"] < best], [r for r in rows if r["reward"] >= best]


def _batch(rows: list[dict], pad_id: int):
    prompt, prompt_mask = pad_left([r["prompt_ids"] for r in rows], pad_id)            # (B, P)
    completion, mask = pad_right([r["completion_ids"] for r in rows], pad_id)          # (B, T)
    return torch.cat([prompt, completion], 1), torch.cat([prompt_mask, mask], 1), mask


def negative_finetune(model, pad_id: int, negatives: list[dict], positives: list[dict], lr: float, steps: int,
                      batch_size: int, positive_weight: float, seed: int, log=None) -> dict:
    """`steps` updates of unlikelihood on negatives + positive_weight * NLL on positives."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    metrics = {}
    for step in range(steps):
        neg = rng.sample(negatives, min(batch_size, len(negatives)))
        ids, attn, mask = _batch(neg, pad_id)
        logp, _ = token_logprobs(model, ids, attn, mask.size(1))                        # (B, T)
        ul = unlikelihood_loss(logp, mask.to(logp.device))
        nll = torch.zeros((), device=logp.device)
        if positives and positive_weight:
            pos = rng.sample(positives, min(batch_size, len(positives)))
            ids, attn, pmask = _batch(pos, pad_id)
            plogp, _ = token_logprobs(model, ids, attn, pmask.size(1))                  # (B, T)
            pmask = pmask.to(plogp.device)
            nll = -(plogp * pmask).sum() / pmask.sum().clamp(min=1)
        loss = ul + positive_weight * nll
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        metrics = {"negative_ft/unlikelihood": float(ul.detach()), "negative_ft/nll": float(nll.detach()),
                   "negative_ft/loss": float(loss.detach())}
        if log:
            log(metrics, step + 1)
    return {**metrics, "negative_ft/negatives": float(len(negatives)), "negative_ft/positives": float(len(positives))}
