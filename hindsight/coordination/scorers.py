"""The scoring role as the RL run holds it: scorers in this process sharing the stage's models
(the reference, the reward model and the guarded reward process), or a Ray pool of scorer
actors; and the count of each reward's failures per step, until the step's metrics take them: a
reward that fails on (nearly) every completion stops the run (`rl.scoring.failure_stop`)."""
from __future__ import annotations

from functools import partial

from hindsight.coordination.roles import deal
from hindsight.errors import RewardError
from hindsight.models.lora import AdapterDisabled
from hindsight.models.load import load_causal_lm, load_reward_model
from hindsight.scoring.guarded import RewardWorker
from hindsight.scoring.rewards import add_failures
from hindsight.scoring.scorer import Scorer, score_batch


class Scorers:
    def __init__(self, cfg, init_path: str, rm_path: str | None, policy, pad_id: int, store, rl_dir):
        rl = self.rl = cfg.rl
        self.ref = self.rm = self.reward_worker = self.pool = None
        self.local: list[Scorer] = []
        self._failures: dict[int, dict[str, list]] = {}  # step -> {reward: [failed calls, first failure]}
        self._scored: dict[int, int] = {}                  # step -> completions scored in this process's calls
        if rl.workers.placement == "ray":  # the actors hold the reference, reward model and rewards
            from hindsight.coordination.placement import RayScorerPool

            self.pool = RayScorerPool(rl.workers.scorer, rl, init_path, rm_path, cfg.model.dtype, rl_dir)
            return
        if rl.kl.coef > 0:  # with LoRA, the base under the policy's adapter: no second copy
            self.ref = AdapterDisabled(policy) if rl.lora.enabled else load_causal_lm(init_path, cfg.model.dtype).eval()
        self.rm = load_reward_model(rm_path).eval() if rm_path and rl.scoring.reward_model_weight > 0 else None
        self.reward_worker = RewardWorker.for_run(rl)
        self.local = [Scorer(f"local-scorer-{i}", rl, pad_id, self.ref, self.rm, self.reward_worker, store)
                      for i in range(rl.workers.scorer)]

    def score_groups(self, step: int, groups: list[int], store) -> None:
        """Groups without a score part go to the scorers; their reward failures are counted."""
        done = store.with_parts("scores", step, groups)
        todo = [g for g in groups if g not in done]
        if self.pool is not None and todo:
            results = [self.pool.dispatch(step, todo, store)]
        else:
            unit = partial(score_batch, groups_per_batch=self.rl.rollout.groups_per_batch)
            results = [s.score(step, share) for s, share in zip(self.local, deal(todo, len(self.local), unit)) if share]
        for failures in results:
            self.count_failures(step, failures)
        self.count_scored(step, len(todo) * self.rl.samples_per_prompt)

    def count_failures(self, step: int, failures: dict[str, list]) -> None:
        add_failures(self._failures.setdefault(step, {}), failures)

    def count_scored(self, step: int, completions: int) -> None:
        self._scored[step] = self._scored.get(step, 0) + completions

    def step_metrics(self, step: int) -> dict:
        """The step's reward failures and failure rates, and (in this process) the seconds spent
        in rewards and models. Raises when a reward failed on rl.scoring.failure_stop of them."""
        failures, scored = self._failures.pop(step, {}), self._scored.pop(step, 0)
        metrics = {f"reward/failures/{k}": float(n) for k, (n, _) in failures.items()}
        if scored:
            metrics.update({f"reward/failure_rate/{k}": n / scored for k, (n, _) in failures.items()})
        broken = failed_reward(failures, scored, self.rl.scoring.failure_stop)
        if broken:
            raise RewardError(f"step {step}: {broken}; nothing is registered. Fix the reward or the columns it "
                              f"reads (data.columns, per file), then rerun the same command")
        if self.local:
            metrics["time/compute/score_s"] = sum(s.compute_s for s in self.local)
            for s in self.local:
                s.compute_s = 0.0
        if self.pool is not None:
            metrics.update(self.pool.metrics())  # scorer deaths and reassigned groups
        if self.reward_worker is not None:  # so far in the run, as the pools count their deaths
            metrics["workers/reward_worker_replaced"] = float(self.reward_worker.replaced)
        return metrics

    def close(self) -> None:
        if self.reward_worker is not None:
            self.reward_worker.close()
        if self.pool is not None:
            self.pool.close()


def failed_reward(failures: dict[str, list], scored: int, share: float) -> str | None:
    """The first reward that failed on at least `share` of `scored` completions, described with
    its first failure; None when every reward mostly works."""
    for name, (n, error) in failures.items():
        if scored and n >= share * scored:
            return f"reward {name} failed on {n} of {scored} completions (rl.scoring.failure_stop {share:g}): {error}"
    return None
