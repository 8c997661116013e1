"""Where rollout workers and scorers run: the worker-pool registry (`rl.workers.placement`) and
what each pool can do, read by the config without torch.

A pool is one file under `hindsight/coordination/pools/` that registers its class here
(`@POOLS.register`) with a `Capabilities`. The config refuses a run that asks a pool for
something its capabilities lack (`refusals`), so which features combine is declared by each
pool, not listed as pairs. The built-in pools are named with their module and imported the
first time one is looked up; those modules import torch only when a pool is built.
"""
from __future__ import annotations

from dataclasses import dataclass

from hindsight.registry import Registry


@dataclass(frozen=True)
class Capabilities:
    in_step: bool = True            # samples step s with weights version s (rl.async.max_staleness: 0)
    samples_ahead: bool = False     # samples step s with version s - k while the learner trains (k >= 1)
    dynamic_sampling: bool = True   # scores a round before it samples the next (DAPO's dynamic sampling)
    lora: bool = True               # its workers sample the stage's adapter-wrapped policy
    several_workers: bool = True    # rl.workers.rollout > 1
    learner_ranks: bool = False     # hosts the other ranks of learner.processes > 1
    grows: bool = False             # `hindsight scale` adds or removes workers while the stage runs


# (capability, the setting that asks for it, whether rl asks for it, what to do instead)
FEATURES = (
    ("in_step", "async.max_staleness: 0", lambda rl: not rl.async_.max_staleness, ""),
    ("samples_ahead", "async.max_staleness >= 1", lambda rl: rl.async_.max_staleness >= 1, ""),
    ("dynamic_sampling", "dynamic_sampling.enabled", lambda rl: rl.dynamic_sampling.enabled, ""),
    ("lora", "lora.enabled", lambda rl: rl.lora.enabled, ""),
    ("several_workers", "workers.rollout > 1", lambda rl: rl.workers.rollout > 1, ""),
    ("learner_ranks", "learner.processes > 1", lambda rl: rl.learner.processes > 1,
     " (its other ranks run as Ray actors: set rl.workers.placement: ray)"),
)


def _has_capabilities(cls) -> None:
    if not isinstance(getattr(cls, "capabilities", None), Capabilities) or not getattr(cls, "summary", ""):
        raise ValueError(f"worker pool {cls.__name__} needs `capabilities` (a Capabilities) and a `summary`")


POOLS: Registry[type] = Registry("worker pool", validate=_has_capabilities, built_in={
    "local": "hindsight.coordination.pools.inprocess",
    "subprocess": "hindsight.coordination.pools.subprocess",
    "ray": "hindsight.coordination.pools.ray",
})


def pool_name(rl) -> str:
    """The pool a run's workers are placed in: `rl.workers.placement`, where `local` with
    `rl.async.max_staleness >= 1` is the sampler process (one rollout worker beside the learner)."""
    placement = rl.workers.placement
    return "subprocess" if placement == "local" and rl.async_.max_staleness else placement


def refusals(rl) -> list[str]:
    """What `rl` asks of its pool that the pool cannot do, one sentence each."""
    pool = POOLS.lookup(pool_name(rl))
    return [f"{pool.summary}; it does not combine with {setting}{instead}"
            for capability, setting, asked, instead in FEATURES
            if asked(rl) and not getattr(pool.capabilities, capability)]
