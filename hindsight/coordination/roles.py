"""Dealing work to the RL run's roles, and starting the learner group's other ranks."""
from __future__ import annotations


def deal(items: list, n: int, unit=None) -> list[list]:
    """Round-robin shares of `items` for n workers; items with the same `unit(item)` (a sampling
    batch) stay together in one share."""
    if unit is None:
        return [items[i::n] for i in range(n)]
    units: dict = {}
    for item in items:
        units.setdefault(unit(item), []).append(item)
    return [[x for u in list(units.values())[i::n] for x in u] for i in range(n)]


def start_learner_group(cfg, learner, ckpt, start: int | None, pad_id: int):
    """Learner ranks 1..P-1 (rl.workers.learner = P > 1) in one group with this process, for the
    whole stage; None for a learner of one process."""
    if cfg.rl.workers.learner == 1:
        return None
    from hindsight.coordination.placement import LearnerGroup

    return LearnerGroup(cfg.rl.workers.learner, cfg.rl, learner.resume_files(ckpt, start), cfg.model, pad_id,
                        cfg.seed, learner.policy, learner.critic)
