"""Scorers in the stage's process, sharing its models (the reference, the reward model and the
guarded reward process): how the in-process and the sampler-process pools score a step's groups
(the sampler process scores what it samples; these score what it did not, after a resume)."""
from __future__ import annotations

from functools import partial

from hindsight.coordination.pools.base import PoolContext
from hindsight.coordination.roles import deal


class LocalScoring:
    def __init__(self, ctx: PoolContext):
        from hindsight.models.load import load_causal_lm, load_reward_model
        from hindsight.models.lora import AdapterDisabled
        from hindsight.scoring.guarded import RewardWorker
        from hindsight.scoring.scorer import Scorer

        rl = self.rl = ctx.cfg.rl
        self.ref = self.rm = None
        if rl.kl.coef > 0:  # with LoRA, the base under the policy's adapter: no second copy
            self.ref = (AdapterDisabled(ctx.policy) if rl.lora.enabled
                        else load_causal_lm(ctx.init_path, ctx.cfg.model.dtype).eval())
        if ctx.rm_path and rl.scoring.reward_model_weight > 0:
            self.rm = load_reward_model(ctx.rm_path).eval()
        self.reward_worker = RewardWorker.for_run(rl)
        self.scorers = [Scorer(f"local-scorer-{i}", rl, ctx.pad_id, self.ref, self.rm, self.reward_worker, ctx.store)
                        for i in range(rl.workers.scorer)]

    def score(self, step: int, groups: list[int]) -> list[dict]:
        from hindsight.scoring.scorer import score_batch

        unit = partial(score_batch, groups_per_batch=self.rl.rollout.groups_per_batch)
        return [s.score(step, share) for s, share in zip(self.scorers, deal(groups, len(self.scorers), unit)) if share]

    def metrics(self) -> dict[str, float]:
        """The seconds spent in rewards and models since the last call, and the reward worker's
        replacements so far in the run (as the Ray pools count their deaths)."""
        metrics = {"time/compute/score_s": sum(s.compute_s for s in self.scorers)}
        for s in self.scorers:
            s.compute_s = 0.0
        if self.reward_worker is not None:
            metrics["workers/reward_worker_replaced"] = float(self.reward_worker.replaced)
        return metrics

    def close(self) -> None:
        if self.reward_worker is not None:
            self.reward_worker.close()
