"""The scoring role as the RL run holds it: a step's groups scored by the worker pool's scorers
(`coordination.pools`), and the count of each reward's failures per step, until the step's
metrics take them: a reward that fails on (nearly) every completion stops the run
(`rl.scoring.failure_stop`)."""
from __future__ import annotations

from hindsight.errors import RewardError
from hindsight.scoring.rewards import add_failures


class Scorers:
    def __init__(self, rl, pool):
        self.rl, self.pool = rl, pool
        self._failures: dict[int, dict[str, list]] = {}  # step -> {reward: [failed calls, first failure]}
        self._scored: dict[int, int] = {}                  # step -> completions scored in this process's calls

    def score_groups(self, step: int, groups: list[int], store) -> None:
        """Groups without a score part go to the scorers; their reward failures are counted."""
        done = store.with_parts("scores", step, groups)
        todo = [g for g in groups if g not in done]
        for failures in self.pool.score(step, todo) if todo else []:
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
        metrics.update(self.pool.score_metrics())  # time in rewards and models, scorer deaths
        return metrics


def failed_reward(failures: dict[str, list], scored: int, share: float) -> str | None:
    """The first reward that failed on at least `share` of `scored` completions, described with
    its first failure; None when every reward mostly works."""
    for name, (n, error) in failures.items():
        if scored and n >= share * scored:
            return f"reward {name} failed on {n} of {scored} completions (rl.scoring.failure_stop {share:g}): {error}"
    return None
