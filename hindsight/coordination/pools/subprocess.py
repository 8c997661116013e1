"""`rl.workers.placement: local` with `rl.async.max_staleness: k >= 1`: one rollout worker and a
scorer in a process beside the learner (`coordination.sampler`), weights through a pipe
(`transport.pipe`). It samples and scores a step while the learner trains the k before it.

A sampler that died, stopped or hung is replaced: its leases go back to pending, the parts it
wrote are kept, and every step in flight is asked of the new one with the weights version it was
due, kept here on the CPU (the newest k + 1), so the run samples what it would have."""
from __future__ import annotations

from dataclasses import replace

from hindsight.console import say
from hindsight.coordination.liveness import RoleStalled, log_role_event
from hindsight.coordination.pools.base import Collected, PoolContext, WorkerPool, leases, open_groups
from hindsight.coordination.pools.scoring import LocalScoring
from hindsight.errors import StageError
from hindsight.rollout.pools import POOLS, Capabilities
from hindsight.state.rundir import RunDir


@POOLS.register
class SubprocessPool(WorkerPool):
    name = "subprocess"
    summary = "async.max_staleness >= 1 runs one sampler process"
    capabilities = Capabilities(in_step=False, samples_ahead=True, dynamic_sampling=False, lora=False,
                                several_workers=False, learner_ranks=False, grows=False)

    def __init__(self, ctx: PoolContext):
        import torch

        from hindsight.coordination.sampler import SamplerSpec, split_threads

        self.ctx, self.rl, self.paths = ctx, ctx.cfg.rl, RunDir.of(ctx.cfg).rl
        self.scoring = LocalScoring(ctx)  # scores what the sampler did not (a resumed run's stored rollouts)
        self.reward_worker = self.scoring.reward_worker
        threads, self._threads_before = torch.get_num_threads(), None
        if not torch.cuda.is_available():  # the two processes run at once: they split the cores
            threads, learner_threads = split_threads(torch.get_num_threads())  # the stage's share
            self._threads_before = torch.get_num_threads()
            torch.set_num_threads(learner_threads)
        rm = ctx.rm_path if ctx.rm_path and self.rl.scoring.reward_model_weight > 0 else None
        self._spec = SamplerSpec(self.rl, ctx.policy_path, ctx.cfg.model.dtype, ctx.cfg.seed, str(ctx.store.root),
                                 ctx.init_path, ctx.version, threads, rm)
        self.version, self.replaced = ctx.version, 0
        self.engine_published: dict[str, float] = {}  # the sampler engine's last push, as it reported it
        self._kept: dict[int, dict] = {}
        self._flight: dict[int, tuple] = {}  # step -> (tasks, version): asked of the sampler, not collected
        self._keep(ctx.version, ctx.policy)
        try:
            self.sampler = self._new_sampler(ctx.version)
        except BaseException:  # not built: the run cannot close it, so what it changed is undone here
            self._restore_threads()
            self.scoring.close()
            raise

    def _new_sampler(self, version: int):
        from hindsight.coordination.sampler import AsyncSampler

        return AsyncSampler(replace(self._spec, version=version), self.paths.sampler_log, self.paths.stalls)

    def publish(self, version: int, policy) -> dict[str, float]:
        self.version = version
        sent = self.sampler.publish(version, policy)
        self._keep(version, policy)
        return sent

    def _keep(self, version: int, policy) -> None:
        """A CPU copy of each weights version a step in flight may still need (the newest k+1)."""
        self._kept[version] = {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}
        for old in [v for v in self._kept if v < version - self.rl.async_.max_staleness]:
            del self._kept[old]

    def submit(self, step, tasks, version) -> None:
        self._flight[step] = (tasks, version)
        self._lease(step, tasks, version)

    def _lease(self, step: int, tasks, version: int) -> None:
        """Lease the step's groups not yet written to the sampler and ask it for them."""
        todo = open_groups(self.ctx.ledger, self.ctx.store, step, tasks)
        shares = list(leases(self.ctx.ledger, step, todo, tasks, ["sampler"], self.rl.rollout.groups_per_batch,
                             lambda _: self.rl.workers.lease_ttl_s))
        self.sampler.submit(step, shares[0][1] if shares else [], version)  # nothing left: an empty answer

    def collect(self, step: int) -> Collected:
        while True:
            try:
                result = self.sampler.wait(step)
                break
            except RoleStalled as exc:
                self._replace(step, exc)
        del self._flight[step]
        self.engine_published = result.get("engine") or {}
        if result["groups"]:
            self.ctx.ledger.move(step, result["groups"], "sealed")
        return Collected(groups=result["groups"], failures=result["failures"],
                         scored=len(result["groups"]) * self.rl.samples_per_prompt)

    def _replace(self, step: int, stalled: RoleStalled) -> None:
        w = self.rl.workers
        if self.replaced >= w.replacements:
            raise StageError(f"rl.async: {stalled}, and {self.replaced} replacements were made already "
                             f"(rl.workers.replacements {w.replacements}); rerun to resume from the newest "
                             f"checkpoint") from None
        self.replaced += 1
        self.sampler.close()
        log_role_event(self.paths.workers_log, "sampler", step, stalled)
        say(f"rl: step {step}: the {stalled}; replaced ({self.replaced} of rl.workers.replacements {w.replacements})")
        self.on_progress()
        needs = {s: version for s, (_, version) in self._flight.items()}
        self.sampler = self._new_sampler(min(needs.values(), default=self.version))
        for version in sorted(set(needs.values())):
            self.sampler.publish(version, _Weights(self._kept[version]))
            for s in sorted(s for s in needs if needs[s] == version):
                self._lease(s, self._flight[s][0], version)
        if self.version not in needs.values():  # the newest version, for the steps fed after these
            self.sampler.publish(self.version, _Weights(self._kept[self.version]))

    def score(self, step: int, groups: list[int]) -> list[dict]:
        return self.scoring.score(step, groups)

    def sample_metrics(self) -> dict[str, float]:
        return {"workers/sampler_replaced": float(self.replaced), **self.engine_published}

    def score_metrics(self) -> dict[str, float]:
        return self.scoring.metrics()

    def children(self) -> list[tuple]:
        alive = self.sampler.proc.poll() is None
        return [("async sampler", self.sampler.proc.pid, self.sampler.log_path)] if alive else []

    def close(self) -> None:
        self.sampler.close()
        self._restore_threads()
        self.scoring.close()

    def _restore_threads(self) -> None:
        import torch

        if self._threads_before:
            torch.set_num_threads(self._threads_before)


class _Weights:
    """A kept weights version, as the senders read a model (`state_dict()`)."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def state_dict(self) -> dict:
        return self.tensors
