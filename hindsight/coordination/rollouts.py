"""The coordinator's side of asynchronous RL (`rl.async.max_staleness: k >= 1`), mixed into `RLRun`.

Step s is submitted to the sampler process the moment weights version s - k exists, so it is
sampled while the learner trains steps s - k .. s - 1. Results are merged into the step's shard
when the learner needs them. A checkpoint at step c waits for the shards of steps c .. c+k-1:
their weights versions (c-k .. c-1) are not kept, so a resume must find them stored.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from hindsight.errors import CheckpointError
from hindsight.rollout.worker import GroupTask, with_batch_mates
from hindsight.coordination.sampler import AsyncSampler, SamplerSpec, split_threads, version_for


class AsyncRollouts:
    """Needs from RLRun: rl, cfg, dir, store, ledger, version, policy, init_path, select_prompts,
    _open_groups and _failures."""

    def _start_sampler(self, policy_path: str, rm_path: str | None) -> AsyncSampler | None:
        self.sampler, self._rolled, self._ahead, self._threads_before = None, {}, {}, None
        self.rm_path = rm_path if rm_path and self.rl.reward_model_weight > 0 else None
        k = self.rl.async_.max_staleness
        if not k:
            return None
        sampler_threads = torch.get_num_threads()
        if not torch.cuda.is_available():  # the two processes run at once: they split the cores
            sampler_threads, learner_threads = split_threads(os.cpu_count() or 1)
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(learner_threads)
        self.sampler = AsyncSampler(SamplerSpec(self.rl, policy_path, self.cfg.model.dtype, self.cfg.seed,
                                                str(self.store.root), self.init_path, self.version, sampler_threads,
                                                self.rm_path),
                                    self.dir / "sampler.log")
        self._feed()
        return self.sampler

    def _close_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
        if self._threads_before:
            torch.set_num_threads(self._threads_before)

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
        prompts, metrics = self.select_prompts(step)
        tasks = [GroupTask(step=step, group=i, round=0, prompt=p) for i, p in enumerate(prompts)]
        todo = with_batch_mates(self._open_groups(step, tasks), tasks, self.rl.rollout.groups_per_batch)
        self._rolled[step] = {"groups": [t.group for t in tasks], "metrics": metrics}
        mine = [t.group for t in todo if t.write]
        if mine:
            self.ledger.move(step, mine, "leased", worker="sampler", ttl_s=self.rl.workers.lease_ttl_s)
        self.sampler.submit(step, todo, need)

    def _async_rollout(self, step: int) -> tuple[Path, dict]:
        """Wait for the sampler's step (submitting it first if it could not be before), then merge it."""
        if step not in self.sampler.submitted:
            self._submit(step)
        t0 = time.perf_counter()
        result = self.sampler.wait(step)
        written = result["groups"]
        counts = self._failures.setdefault(step, {})
        for name, n in result["failures"].items():
            counts[name] = counts.get(name, 0) + n
        if written:
            self.ledger.move(step, written, "sealed")
        info = self._rolled.pop(step)
        path = self.store.merge_parts("rollouts", step, info["groups"])
        versions = self.store.column("rollouts", step, "weights_version")
        return path, {**info["metrics"], "time/rollout_wait_s": time.perf_counter() - t0,
                      "async/staleness": float(step - min(versions)),
                      "async/weights_version": float(min(versions))}

    def _wait_ahead(self, done: int) -> None:
        """Before a checkpoint at `done`: the shards of steps done .. done+k-1 are stored."""
        for step in range(done, min(done + self.rl.async_.max_staleness, self.rl.steps)):
            if not self.store.has("rollouts", step):
                self._ahead[step] = self._async_rollout(step)
