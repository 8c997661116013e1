"""`rl.workers.placement: local`: rollout workers and scorers in the stage's process, sharing the
learner's policy object (a new weights version is the same tensors, `transport.inprocess`).
A step's groups are sampled when the run collects them, worker after worker."""
from __future__ import annotations

from hindsight.coordination.pools.base import Collected, InStepPool, PoolContext, leases
from hindsight.coordination.pools.scoring import LocalScoring
from hindsight.rollout.pools import POOLS, Capabilities


@POOLS.register
class InProcessPool(InStepPool):
    name = "local"
    summary = "workers.placement: local runs every role in the stage's process"
    capabilities = Capabilities(in_step=True, samples_ahead=False, dynamic_sampling=True, lora=True,
                                several_workers=True, learner_ranks=False, grows=False)

    def __init__(self, ctx: PoolContext):
        from hindsight.rollout.worker import RolloutWorker
        from hindsight.transport.inprocess import InProcessSender

        super().__init__(ctx)
        self.rl = ctx.cfg.rl
        self.workers = {f"local-{i}": RolloutWorker(f"local-{i}", ctx.policy, ctx.tok, self.rl, ctx.cfg.seed,
                                                    ctx.store, ctx.init_path)
                        for i in range(self.rl.workers.rollout)}
        for worker in self.workers.values():
            worker.start_at(ctx.version)
        self.sender = InProcessSender(list(self.workers.values()))
        self.scoring = LocalScoring(ctx)
        self.reward_worker = self.scoring.reward_worker

    def publish(self, version: int, policy) -> dict[str, float]:
        return self.sender.publish(version, policy)

    def collect(self, step: int) -> Collected:
        todo, tasks, version = self._take(step)
        ledger, ttl = self.ctx.ledger, self.rl.workers.lease_ttl_s
        for worker_id, share in leases(ledger, step, todo, tasks, list(self.workers), self.rl.rollout.groups_per_batch,
                                       lambda _: ttl):
            ledger.move(step, self.workers[worker_id].generate(share, version), "sealed")
        return Collected()

    def score(self, step: int, groups: list[int]) -> list[dict]:
        return self.scoring.score(step, groups)

    def sample_metrics(self) -> dict[str, float]:
        """How much of the rollout time was the engine itself, and what its last weights push
        measured and checked (an engine with a copy of its own: `engine/*`)."""
        metrics = {"time/compute/generate_s": sum(w.compute_s for w in self.workers.values())}
        for w in self.workers.values():
            w.compute_s = 0.0
            metrics.update(w.engine_published)
        return metrics

    def score_metrics(self) -> dict[str, float]:
        return self.scoring.metrics()

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
        self.scoring.close()
