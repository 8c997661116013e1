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


def start_learner_group(cfg, pad_id: int, files: dict, policy, critic):
    """The learner group of the stage (rl.workers.learner = P ranks; this process is rank 0), for
    the whole stage; a sharded learner of one process has a group of one."""
    from hindsight.coordination.learner_group import LearnerGroup

    return LearnerGroup(cfg.rl.workers.learner, cfg.rl, files, cfg.model, pad_id, cfg.seed, policy, critic)
