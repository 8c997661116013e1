"""The rollout role as the RL run holds it: a step's prompts, the rounds of dynamic sampling,
and when each step is sampled; where its groups are sampled is the worker pool's
(`coordination.pools`).

In step (`rl.async.max_staleness: 0`), step s is sampled with weights version s when the run
asks for it. Ahead (k >= 1, a pool that samples ahead), step s is submitted the moment weights
version s - k exists, so it is sampled while the learner trains steps s - k .. s - 1, and merged
into its shard when the learner needs it. A checkpoint at step c waits for the shards of steps
c .. c+k-1: their weights versions (c-k .. c-1) are not kept, so a resume must find them stored.
"""
from __future__ import annotations

import time
from pathlib import Path

from hindsight.coordination.replay import signal_groups
from hindsight.coordination.sampler import version_for
from hindsight.errors import CheckpointError
from hindsight.faults import crash_point
from hindsight.rollout.tasks import GroupTask


class Rollouts:
    def __init__(self, rl, pool, scorers, store, prompts, version: int):
        self.rl, self.pool, self.scorers, self.store, self.prompts = rl, pool, scorers, store, prompts
        self.version = version
        self.ahead = bool(pool.capabilities.samples_ahead and rl.async_.max_staleness)  # the config checked the pair
        self._rolled: dict[int, dict] = {}  # ahead: a step submitted, not collected -> its groups and prompt metrics
        self._ahead: dict[int, tuple] = {}  # ahead: a step merged early, before a checkpoint
        if self.ahead:
            self._feed()

    def take_ahead(self, step: int) -> tuple[Path, dict] | None:
        """A step merged early, before a checkpoint (`wait_ahead`), with its metrics."""
        return self._ahead.pop(step, None)

    # --- sampling a step ------------------------------------------------------------------
    def sample(self, step: int) -> tuple[Path, dict]:
        """Sample the step's groups. With dynamic sampling, sample further rounds of fresh
        prompts (DAPO) until `prompts_per_step` groups carry a signal or `max_rounds` is reached."""
        if self.ahead:
            return self._collect_ahead(step)
        batch, metrics = self.prompts.for_step(step)
        t0 = time.perf_counter()
        rows = self._sample(step, 0, batch, first_group=0)
        rounds, ds = 1, self.rl.dynamic_sampling
        while ds.enabled and rounds < ds.max_rounds and self._signal_groups(step, rows) < self.rl.prompts_per_step:
            rows += self._sample(step, rounds, self.prompts.for_round(step, rounds), first_group=rows[-1]["group"] + 1)
            rounds += 1
        seconds = time.perf_counter() - t0
        if ds.enabled:
            metrics["dynamic_sampling/rounds"] = float(rounds)
        crash_point("rollout", step)
        n_tokens = sum(len(r["completion_ids"]) for r in rows)
        metrics.update(self.pool.sample_metrics())
        metrics.update({"time/rollout_s": seconds, "rollout/tokens_per_s": n_tokens / max(seconds, 1e-9)})
        return self.store.merge_parts("rollouts", step, sorted({r["group"] for r in rows})), metrics

    def _sample(self, step: int, round_: int, prompts: list[dict], first_group: int) -> list[dict]:
        """One round's groups, sampled by the pool. A group whose part an earlier attempt wrote is
        kept, not sampled again: a worker that died mid-lease loses only the groups it had not finished."""
        tasks = [GroupTask(step=step, group=first_group + i, round=round_, prompt=p) for i, p in enumerate(prompts)]
        self.pool.submit(step, tasks, self.version)
        self.pool.collect(step)
        by_group = self.store.groups_rows("rollouts", step, [t.group for t in tasks])
        return [row for t in tasks for row in by_group[t.group]]

    def _signal_groups(self, step: int, rows: list[dict]) -> int:
        """How many of the rows' groups have rewards that differ: they are scored now (their score
        parts are what the step's scoring then merges, so nothing is scored twice)."""
        groups = sorted({r["group"] for r in rows})
        self.scorers.score_groups(step, groups, self.store)
        rewards = [s["reward"] for g in groups for s in self.store.read_part("scores", step, g)]
        kept, _ = signal_groups(rewards, self.rl.samples_per_prompt, len(rows))
        return len(kept)

    # --- a new weights version ------------------------------------------------------------
    def publish(self, policy) -> dict[str, float]:
        """A new weights version, through the pool's transport (`hindsight.transport`)."""
        self.version += 1
        sent = self.pool.publish(self.version, policy)
        if self.ahead:
            self._feed()  # the steps this version makes due
        return sent

    # --- sampling ahead ---------------------------------------------------------------------
    def _feed(self) -> None:
        """Submit every step whose weights version now exists and whose shard is not stored."""
        k = self.rl.async_.max_staleness
        first = 0 if self.version == 0 else self.version + k
        for step in range(first, min(self.version + k + 1, self.rl.steps)):
            if step not in self._rolled and not self.store.has("rollouts", step):
                self._submit(step)

    def _submit(self, step: int) -> None:
        need = version_for(step, self.rl.async_.max_staleness)
        if need != self.version:
            raise CheckpointError(f"{self.store.root}: step {step} must be sampled with weights version {need}, "
                                  f"but its rollouts are not stored and this run holds version {self.version}")
        prompts, metrics = self.prompts.for_step(step)
        tasks = [GroupTask(step=step, group=i, round=0, prompt=p) for i, p in enumerate(prompts)]
        self._rolled[step] = {"groups": [t.group for t in tasks], "metrics": metrics}
        self.pool.submit(step, tasks, need)

    def _collect_ahead(self, step: int) -> tuple[Path, dict]:
        """Wait for the pool's step (submitting it first if it could not be before), then merge it."""
        if step not in self._rolled:
            self._submit(step)
        t0 = time.perf_counter()
        result = self.pool.collect(step)
        self.scorers.count_failures(step, result.failures)  # the pool scored what it sampled
        self.scorers.count_scored(step, result.scored)
        info = self._rolled.pop(step)
        path = self.store.merge_parts("rollouts", step, info["groups"])
        versions = self.store.column("rollouts", step, "weights_version")
        return path, {**info["metrics"], **self.pool.sample_metrics(), "time/rollout_wait_s": time.perf_counter() - t0,
                      "async/staleness": float(step - min(versions)), "async/weights_version": float(min(versions))}

    def wait_ahead(self, done: int) -> None:
        """Before a checkpoint at `done`: the shards of steps done .. done+k-1 are stored."""
        if not self.ahead:
            return
        for step in range(done, min(done + self.rl.async_.max_staleness, self.rl.steps)):
            if not self.store.has("rollouts", step):
                self._ahead[step] = self._collect_ahead(step)
