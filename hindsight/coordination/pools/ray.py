"""`rl.workers.placement: ray`: rollout workers and scorers as Ray actors
(`coordination.placement`, the only module that imports ray), weights through Ray's object store
(`transport.ray`). A dead or silent actor's unwritten groups go to a replacement; `hindsight
scale` grows or shrinks the rollout actors at a step boundary. The learner's other ranks
(learner.processes > 1) are Ray actors too (`coordination.learner_group`)."""
from __future__ import annotations

from hindsight.coordination.pools.base import Collected, InStepPool, PoolContext
from hindsight.rollout.pools import POOLS, Capabilities
from hindsight.state.rundir import RunDir


@POOLS.register
class RayPool(InStepPool):
    name = "ray"
    summary = "workers.placement: ray samples on Ray actors in step with the learner"
    capabilities = Capabilities(in_step=True, samples_ahead=False, dynamic_sampling=True, lora=False,
                                several_workers=True, learner_ranks=True, grows=True)

    @classmethod
    def preflight(cls, cfg) -> None:
        from hindsight.coordination.placement import start_ray

        w = cfg.rl.workers
        start_ray(w.ray_address, w.needs(cfg.rl.learner.processes))

    def __init__(self, ctx: PoolContext):
        from hindsight.coordination.placement import RayRolloutPool, RayScorerPool

        super().__init__(ctx)
        cfg, self.rl = ctx.cfg, ctx.cfg.rl
        rl_dir = RunDir.of(cfg).rl.path
        # the actors build their copies from the folder the learner started from: version ctx.version
        self.rollout = RayRolloutPool(self.rl.workers.rollout, self.rl, ctx.policy_path, cfg.model.dtype, cfg.seed,
                                      rl_dir, ctx.init_path, ctx.version, ledger=ctx.ledger)
        self.scorer = None
        try:  # the actors hold the reference, the reward model and the rewards
            self.scorer = RayScorerPool(self.rl.workers.scorer, self.rl, ctx.init_path, ctx.rm_path, cfg.model.dtype,
                                        rl_dir)
        finally:
            if self.scorer is None:
                self.rollout.close()

    def publish(self, version: int, policy) -> dict[str, float]:
        return self.rollout.publish(version, policy)

    def collect(self, step: int) -> Collected:
        todo, tasks, version = self._take(step)
        self.rollout.resize(step)  # a `hindsight scale` request, at the step boundary
        self.rollout.dispatch(step, todo, tasks, version, self.ctx.store)
        return Collected()

    def score(self, step: int, groups: list[int]) -> list[dict]:
        return [self.scorer.dispatch(step, groups, self.ctx.store)]

    def sample_metrics(self) -> dict[str, float]:
        """Deaths and reassigned groups so far in the run, and the rollout actors now."""
        return {**self.rollout.metrics(), "workers/rollout": float(len(self.rollout.actors))}

    def score_metrics(self) -> dict[str, float]:
        return self.scorer.metrics()

    def close(self) -> None:
        for pool in (self.rollout, self.scorer):
            if pool is not None:
                pool.close()
