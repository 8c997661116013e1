"""A test-only worker pool, written as docs/design.md says adding a pool takes: one file and its
registration. Rollout workers in the stage's process, each with a policy copy of its own that the
test-only transport (`copy_transport.py`) keeps current; the last worker given a share samples
first. (Not threads: workers sharing one policy object would race, `maths.logprobs` patches a
module while it runs.)"""
from hindsight.coordination.pools.base import Collected, InStepPool, leases
from hindsight.coordination.pools.scoring import LocalScoring
from hindsight.rollout.pools import POOLS, Capabilities
from hindsight.rollout.worker import RolloutWorker

from copy_transport import CopySender


@POOLS.register
class ReversedPool(InStepPool):
    name = "reversed"
    summary = "workers.placement: reversed samples with the last worker first"
    capabilities = Capabilities(lora=False)
    shares: list[tuple[int, list[str]]] = []  # (step, the workers given a share) of each collect

    def __init__(self, ctx):
        super().__init__(ctx)
        self.rl = ctx.cfg.rl
        self.workers = {f"reversed-{i}": RolloutWorker.from_paths(f"reversed-{i}", ctx.policy_path, ctx.cfg.model.dtype,
                                                                  self.rl, ctx.cfg.seed, str(ctx.store.root), ctx.init_path)
                        for i in range(self.rl.workers.rollout)}
        for worker in self.workers.values():
            worker.start_at(ctx.version)
        self.sender, self.scoring = CopySender(list(self.workers.values())), LocalScoring(ctx)

    def publish(self, version, policy):
        return self.sender.publish(version, policy)

    def collect(self, step):
        todo, tasks, version = self._take(step)
        ledger = self.ctx.ledger
        shares = dict(leases(ledger, step, todo, tasks, list(self.workers), self.rl.rollout.groups_per_batch,
                             lambda _: self.rl.workers.lease_ttl_s))
        for worker_id in reversed(shares):
            ledger.move(step, self.workers[worker_id].generate(shares[worker_id], version), "sealed")
        ReversedPool.shares.append((step, list(reversed(shares))))
        return Collected()

    def score(self, step, groups):
        return self.scoring.score(step, groups)

    def score_metrics(self):
        return self.scoring.metrics()

    def close(self):
        self.scoring.close()
