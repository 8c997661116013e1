"""The rollout role as the RL run holds it: rollout workers in this process (sharing the learner's
policy object), a Ray pool of them, or with `rl.async.max_staleness: k >= 1` the sampler process.

Groups are leased through the ledger; a group whose part is on disk is sealed by it and never
sampled again. Asynchronously, step s is submitted the moment weights version s - k exists, so
it is sampled while the learner trains steps s - k .. s - 1, and merged into its shard when the
learner needs it. A checkpoint at step c waits for the shards of steps c .. c+k-1: their
weights versions (c-k .. c-1) are not kept, so a resume must find them stored.
"""
from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from hindsight.coordination.replay import signal_groups
from hindsight.coordination.roles import deal
from hindsight.coordination.liveness import RoleStalled, log_role_event
from hindsight.coordination.sampler import AsyncSampler, SamplerSpec, split_threads, version_for
from hindsight.console import say
from hindsight.errors import CheckpointError, StageError
from hindsight.faults import crash_point
from hindsight.rollout.worker import GroupTask, RolloutWorker, batch_of, with_batch_mates
from hindsight.state.rundir import RunDir
from hindsight.transport.inprocess import InProcessSender


class Rollouts:
    def __init__(self, cfg, policy, policy_path: str, init_path: str, tok, store, ledger, prompts, version: int):
        self.cfg, self.rl, self.store, self.ledger, self.prompts = cfg, cfg.rl, store, ledger, prompts
        self.policy_path, self.init_path, self.version = policy_path, init_path, version
        self.workers: list[RolloutWorker] = []
        self.pool = self.sampler = self.scorers = self.sender = None
        self.pool_metrics: dict[str, float] = {}  # the Ray pool's deaths and reassignments, logged per step
        self._rolled, self._ahead, self._threads_before = {}, {}, None
        self._policy, self._kept, self.replaced = policy, {}, 0  # async: what a replaced sampler is given
        self.on_progress = lambda: None  # told when a role is replaced: the step watchdog's clock restarts
        if self.rl.async_.max_staleness:  # the sampler process samples, with weights of its own
            return
        if self.rl.workers.placement == "ray":
            from hindsight.coordination.placement import RayRolloutPool

            # the actors build their copies from the folder the learner started from: version `version`
            self.pool = self.sender = RayRolloutPool(self.rl.workers.rollout, self.rl, policy_path, cfg.model.dtype,
                                                     cfg.seed, RunDir.of(cfg).rl.path, init_path, version)
            return
        self.workers = [RolloutWorker(f"local-{i}", policy, tok, self.rl, cfg.seed, store, init_path)
                        for i in range(self.rl.workers.rollout)]
        for worker in self.workers:
            worker.start_at(version)
        self.sender = InProcessSender(self.workers)

    def start(self, scorers, rm_path: str | None) -> None:
        """Join the scorers (dynamic sampling scores as it samples); start the async sampler."""
        self.scorers = scorers
        if not self.rl.async_.max_staleness:
            return
        sampler_threads = torch.get_num_threads()
        if not torch.cuda.is_available():  # the two processes run at once: they split the cores
            sampler_threads, learner_threads = split_threads(torch.get_num_threads())  # the stage's share
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(learner_threads)
        rm = rm_path if rm_path and self.rl.scoring.reward_model_weight > 0 else None
        self._spec = SamplerSpec(self.rl, self.policy_path, self.cfg.model.dtype, self.cfg.seed, str(self.store.root),
                                 self.init_path, self.version, sampler_threads, rm)
        self._keep(self.version, self._policy)
        self.sampler = self.sender = self._new_sampler(self.version)
        self._feed()

    def _new_sampler(self, version: int) -> AsyncSampler:
        paths = RunDir.of(self.cfg).rl
        return AsyncSampler(replace(self._spec, version=version), paths.sampler_log, paths.stalls)

    def take_ahead(self, step: int) -> tuple[Path, dict] | None:
        """A step merged early, before a checkpoint (`wait_ahead`), with its metrics."""
        return self._ahead.pop(step, None)

    # --- sampling a step ------------------------------------------------------------------
    def sample(self, step: int) -> tuple[Path, dict]:
        """Sample the step's groups. With dynamic sampling, sample further rounds of fresh
        prompts (DAPO) until `prompts_per_step` groups carry a signal or `max_rounds` is reached."""
        if self.sampler is not None:
            return self._async_rollout(step)
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
        metrics.update(self.pool_metrics)
        metrics.update({"time/rollout_s": seconds, "rollout/tokens_per_s": n_tokens / max(seconds, 1e-9)})
        if self.workers:  # in this process: how much of it was the engine itself
            metrics["time/compute/generate_s"] = sum(w.compute_s for w in self.workers)
            for w in self.workers:
                w.compute_s = 0.0
        return self.store.merge_parts("rollouts", step, sorted({r["group"] for r in rows})), metrics

    def _sample(self, step: int, round_: int, prompts: list[dict], first_group: int) -> list[dict]:
        """One round's groups, leased to the rollout workers through the ledger. A group whose part
        an earlier attempt wrote is kept, not sampled again: a worker that died mid-lease loses
        only the groups it had not finished."""
        tasks = [GroupTask(step=step, group=first_group + i, round=round_, prompt=p) for i, p in enumerate(prompts)]
        todo = self._open_groups(step, tasks)
        if self.pool is not None:
            self.pool.resize(step)
            self.pool_metrics = {**self.pool.dispatch(step, todo, self.store),
                                 "workers/rollout": float(len(self.pool.actors))}
        todo = with_batch_mates(todo, tasks, self.rl.rollout.groups_per_batch)
        unit = partial(batch_of, groups_per_batch=self.rl.rollout.groups_per_batch)
        for worker, share in zip(self.workers, deal(todo, len(self.workers), unit)):
            mine = [t.group for t in share if t.write]
            if mine:
                self.ledger.move(step, mine, "leased", worker=worker.id, ttl_s=self.rl.workers.lease_ttl_s)
                self.ledger.move(step, worker.generate(share, self.version), "sealed")
        by_group = self.store.groups_rows("rollouts", step, [t.group for t in tasks])
        return [row for t in tasks for row in by_group[t.group]]

    def _open_groups(self, step: int, tasks: list[GroupTask]) -> list[GroupTask]:
        """Open the tasks' groups in the ledger; returns those still to sample. A group whose part
        an earlier attempt wrote is sealed by it (a part is written whole or not at all)."""
        self.ledger.open(step, [t.group for t in tasks])
        self.ledger.take_back(step)  # leases of an interrupted attempt (a Prefect task retry) are void
        entries = self.ledger.read(step)
        parts = self.store.with_parts("rollouts", step, [t.group for t in tasks])
        written = [t.group for t in tasks if entries[t.group].state == "pending" and t.group in parts]
        if written:
            self.ledger.move(step, written, "sealed")
        return [t for t in tasks if entries[t.group].state == "pending" and t.group not in written]

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
        """A new weights version, through the placement's transport (`hindsight.transport`): shared
        in process, Ray's object store for the pool, the pipe to the async sampler."""
        self.version += 1
        sent = self.sender.publish(self.version, policy)
        if self.sampler is not None:
            self._keep(self.version, policy)
            self._feed()  # the steps this version makes due
        return sent

    def _keep(self, version: int, policy) -> None:
        """Async: a copy of each weights version a step in flight may still need (the newest k+1),
        on the CPU, so a replaced sampler samples them with exactly the weights the first one had."""
        self._kept[version] = {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}
        for old in [v for v in self._kept if v < version - self.rl.async_.max_staleness]:
            del self._kept[old]

    # --- asynchronous sampling ------------------------------------------------------------
    def _feed(self) -> None:
        """Submit every step whose weights version now exists and whose shard is not stored."""
        k = self.rl.async_.max_staleness
        first = 0 if self.version == 0 else self.version + k
        for step in range(first, min(self.version + k + 1, self.rl.steps)):
            if step not in self.sampler.submitted and not self.store.has("rollouts", step):
                self._submit(step)

    def _submit(self, step: int) -> None:
        need = version_for(step, self.rl.async_.max_staleness)
        if need != self.version:
            raise CheckpointError(f"{self.store.root}: step {step} must be sampled with weights version {need}, "
                                  f"but its rollouts are not stored and this run holds version {self.version}")
        prompts, metrics = self.prompts.for_step(step)
        tasks = [GroupTask(step=step, group=i, round=0, prompt=p) for i, p in enumerate(prompts)]
        self._rolled[step] = {"groups": [t.group for t in tasks], "metrics": metrics, "tasks": tasks}
        self._lease(step, tasks, need)

    def _lease(self, step: int, tasks: list[GroupTask], need: int) -> None:
        """Lease the step's groups not yet written to the sampler and ask it for them."""
        todo = with_batch_mates(self._open_groups(step, tasks), tasks, self.rl.rollout.groups_per_batch)
        mine = [t.group for t in todo if t.write]
        if mine:
            self.ledger.move(step, mine, "leased", worker="sampler", ttl_s=self.rl.workers.lease_ttl_s)
        self.sampler.submit(step, todo, need)

    def _async_rollout(self, step: int) -> tuple[Path, dict]:
        """Wait for the sampler's step (submitting it first if it could not be before), then merge it."""
        if step not in self.sampler.submitted:
            self._submit(step)
        t0 = time.perf_counter()
        while True:
            try:
                result = self.sampler.wait(step)
                break
            except RoleStalled as exc:
                self._replace_sampler(step, exc)
        self.scorers.count_failures(step, result["failures"])  # the sampler scores what it samples
        self.scorers.count_scored(step, len(result["groups"]) * self.rl.samples_per_prompt)
        if result["groups"]:
            self.ledger.move(step, result["groups"], "sealed")
        info = self._rolled.pop(step)
        path = self.store.merge_parts("rollouts", step, info["groups"])
        versions = self.store.column("rollouts", step, "weights_version")
        return path, {**info["metrics"], "time/rollout_wait_s": time.perf_counter() - t0,
                      "async/staleness": float(step - min(versions)), "workers/sampler_replaced": float(self.replaced),
                      "async/weights_version": float(min(versions))}

    def _replace_sampler(self, step: int, stalled: RoleStalled) -> None:
        """A new sampler process for one that died, stopped or hung: its leases go back to pending,
        the parts it wrote are kept, and every step in flight is asked of the new one with the
        weights version it was due (kept by `_keep`), so the run samples what it would have."""
        w = self.rl.workers
        if self.replaced >= w.replacements:
            raise StageError(f"rl.async: {stalled}, and {self.replaced} replacements were made already "
                             f"(rl.workers.replacements {w.replacements}); rerun to resume from the newest "
                             f"checkpoint") from None
        self.replaced += 1
        self.sampler.close()
        log_role_event(RunDir.of(self.cfg).rl.workers_log, "sampler", step, stalled)
        say(f"rl: step {step}: the {stalled}; replaced ({self.replaced} of rl.workers.replacements {w.replacements})")
        flight = sorted(self._rolled)
        needs = {s: version_for(s, self.rl.async_.max_staleness) for s in flight}
        self.on_progress()
        self.sampler = self.sender = self._new_sampler(min(needs.values(), default=self.version))
        for version in sorted(set(needs.values())):
            self.sampler.publish(version, _Weights(self._kept[version]))
            for s in (s for s in flight if needs[s] == version):
                self._lease(s, self._rolled[s]["tasks"], version)
        if self.version not in needs.values():  # the newest version, for the steps fed after these
            self.sampler.publish(self.version, _Weights(self._kept[self.version]))

    def wait_ahead(self, done: int) -> None:
        """Before a checkpoint at `done`: the shards of steps done .. done+k-1 are stored."""
        if self.sampler is None:
            return
        for step in range(done, min(done + self.rl.async_.max_staleness, self.rl.steps)):
            if not self.store.has("rollouts", step):
                self._ahead[step] = self._async_rollout(step)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
        if self._threads_before:
            torch.set_num_threads(self._threads_before)
        if self.pool is not None:
            self.pool.close()


class _Weights:
    """A kept weights version, as the senders read a model (`state_dict()`)."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def state_dict(self) -> dict:
        return self.tensors
