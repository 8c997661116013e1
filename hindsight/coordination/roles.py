"""Starting the RL stage's roles, mixed into `RLRun`: in-process rollout workers and scorers
sharing the stage's models, or Ray pools of them, and the learner group."""
from __future__ import annotations

from hindsight.rollout.worker import RolloutWorker
from hindsight.scoring.scorer import Scorer


def deal(items: list, n: int, unit=None) -> list[list]:
    """Round-robin shares of `items` for n workers; items with the same `unit(item)` (a sampling
    batch) stay together in one share."""
    if unit is None:
        return [items[i::n] for i in range(n)]
    units: dict = {}
    for item in items:
        units.setdefault(unit(item), []).append(item)
    return [[x for u in list(units.values())[i::n] for x in u] for i in range(n)]


class RoleStarts:
    """Needs from RLRun: rl, cfg, ckpt, tok, policy, critic, critic_source, ref, rm, reward_worker,
    store, dir, version and init_path."""

    def _start_learners(self, start: int | None, policy_path: str):
        """Learner ranks 1..P-1 (rl.workers.learner = P > 1) in one group with this process, for the stage."""
        if self.rl.workers.learner == 1:
            return None
        from hindsight.coordination.placement import LearnerGroup

        root = self.ckpt.root
        paths = {"policy": policy_path, "critic": self.critic_source}
        if start:
            paths["optimizer"] = str(root / "optimizer" / f"step-{start:06d}.pt")
            if self.critic is not None:
                paths["critic_optimizer"] = str(root / "critic_optimizer" / f"step-{start:06d}.pt")
        return LearnerGroup(self.rl.workers.learner, self.rl, paths, self.cfg.model.dtype, self.tok.pad_token_id,
                            self.cfg.seed, self.policy, self.critic)

    def _start_scorers(self, rm_path: str | None):
        """(in-process scorers sharing this process's models, or a Ray pool of scorer actors)."""
        if self.rl.workers.placement == "ray":
            from hindsight.coordination.placement import RayScorerPool

            return [], RayScorerPool(self.rl.workers.scorer, self.rl, self.init_path, rm_path, self.cfg.model.dtype,
                                     self.dir)
        return [Scorer(f"local-scorer-{i}", self.rl, self.tok.pad_token_id, self.ref, self.rm, self.reward_worker, self.store)
                for i in range(self.rl.workers.scorer)], None

    def _start_workers(self, policy_path: str):
        """(in-process rollout workers sharing the learner's policy object, or a Ray pool of them)."""
        if self.rl.async_.max_staleness:  # the sampler process samples, with weights of its own
            return [], None
        if self.rl.workers.placement == "ray":
            from hindsight.coordination.placement import RayRolloutPool

            pool = RayRolloutPool(self.rl.workers.rollout, self.rl, policy_path, self.cfg.model.dtype, self.cfg.seed,
                                  self.dir, self.init_path)
            pool.publish(self.version, self.policy.state_dict())
            return [], pool
        workers = [RolloutWorker(f"local-{i}", self.policy, self.tok, self.rl, self.cfg.seed, self.store, self.init_path)
                   for i in range(self.rl.workers.rollout)]
        for worker in workers:
            worker.load_weights(self.version)
        return workers, None
