"""One learner rank: built the same way on every rank of the learner group, whatever its
strategy. Rank 0 is the stage's own process (`learner.Learner` holds it, with the serving copy
and the handle on its peers); a peer is a `LearnerRank` in a Ray actor, its methods called by
rank 0 alongside its own (`alongside`), so every collective runs on all ranks in the same order.

The build is four steps, in this order on every rank: the strategy joins the process group and
builds the models (`strategy.build`: a sharded rank on the meta device, reading only its
slices), makes them agree (`strategy.prepare`: replicated ranks take rank 0's weights), the
optimizers are made, and the resume state is read (`strategy.load`).
"""
from __future__ import annotations

import os
import time
from dataclasses import replace
from functools import partial

from hindsight.maths.experience import Experience, lengths
from hindsight.faults import crash_point
from hindsight.learning.fit import BudgetFit, fit_budget, memory_cap
from hindsight.learning.build import build_critic, build_optimizer, build_policy
from hindsight.learning.health import Health
from hindsight.learning.strategies import get_strategy
from hindsight.learning.strategies.base import collective_timeout_s
from hindsight.learning.update import learner_settings, update
from hindsight.maths.logprobs import model_device


class LearnerRank:
    def __init__(self, rank: int, world: int, init_method: str | None, rl, model_cfg, sources: dict, pad_id: int,
                 seed: int, base: str | None = None, resume: bool = False):
        """`sources`: the strategy's (`Strategy.sources`); `base` and `resume`: a LoRA policy's
        base model and whether its adapter is read back from `sources["policy"]`."""
        self.rank, self.world, self.steps = rank, world, 0
        self.rl, self.settings = rl, learner_settings(rl)
        self.budget: BudgetFit | None = None  # set by `fit` when rl.learner.micro_batch_tokens is auto
        self.most_rows = rl.learner.mini_batch_size or rl.prompts_per_step * rl.samples_per_prompt
        self.health = Health(rl.learner.health)
        self.strategy = get_strategy(rl.learner.strategy)(rank, world, rl.learner)
        self.took: list[float] = []  # seconds of each update: what a collective's timeout follows
        self.timeout_s = collective_timeout_s(self.took, rl.workers)
        self.strategy.join(init_method, self.timeout_s)
        self.critic = self.critic_optimizer = None
        try:
            self.policy = self.strategy.build(partial(build_policy, model_cfg=model_cfg, rl=rl, base=base, seed=seed,
                                                      resume=resume), sources["policy"])
            if sources.get("critic") is not None:
                self.critic = self.strategy.build(partial(build_critic, model_cfg=model_cfg, rl=rl, pad_id=pad_id,
                                                          seed=seed), sources["critic"])
            self.strategy.prepare(self.policy, self.critic)
            self.optimizer = build_optimizer(self.policy, rl.learner.lr)
            if self.critic is not None:
                self.critic_optimizer = build_optimizer(self.critic, self.settings.algorithm_settings.critic_lr)
            self.strategy.load(sources, self.parts())
        except BaseException:  # a half-started rank would hold the process group for the retry
            self.strategy.leave()
            raise

    def parts(self) -> dict[str, tuple]:
        """Each trained model with its optimizer: what the resume state holds."""
        parts = {"policy": (self.policy, self.optimizer)}
        if self.critic is not None:
            parts["critic"] = (self.critic, self.critic_optimizer)
        return parts

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def train(self, exp: Experience) -> dict:
        """This rank's part of one update on the batch (every rank holds all of it)."""
        refit = False
        if self.auto_budget:  # every rank holds the whole batch, so every rank refits, or none
            prompt, completion = (max(n) for n in lengths(exp))
            refit = self.budget.outgrown(prompt + completion)
            if refit:
                self.fit(prompt, completion, self.budget.cap_bytes)
        t0 = time.perf_counter()
        metrics = update(self.policy, self.optimizer, exp, self.settings, self.critic, self.critic_optimizer,
                         share=self.strategy, health=self.health)
        self._follow_step_time(time.perf_counter() - t0)
        if self.auto_budget:
            metrics.update({"learn/micro_batch_tokens": float(self.budget.budget), "learn/budget_refits": float(refit)})
        return metrics

    def _follow_step_time(self, seconds: float) -> None:
        """Collective timeouts from measured update times, not one fixed number: a healthy group on
        a loaded machine is not failed, and a dead peer is found in a few steps' time."""
        self.took = (self.took + [seconds])[-20:]
        timeout = collective_timeout_s(self.took, self.rl.workers)
        if abs(timeout - self.timeout_s) > 0.1 * self.timeout_s:
            self.strategy.set_timeout(timeout)
            self.timeout_s = timeout

    # --- rl.learner.micro_batch_tokens: auto (learning.fit) ---------------------------------
    @property
    def auto_budget(self) -> bool:
        return self.budget is not None

    def fit(self, prompt: int, completion: int, cap: int | None = None, kept: dict | None = None) -> dict:
        """Fit the micro-batch budget for rows of `prompt + completion` tokens under `cap` bytes
        (None: `memory_cap`'s), or take the fit a checkpoint `kept` if it was fitted under the same
        cap (a resumed run then cuts its micro-batches as the run it continues did); returns the fit."""
        cap = cap or self.cap()
        budget = (BudgetFit.from_json(kept) if kept and kept["cap_bytes"] == cap else
                  fit_budget(self.policy, self.optimizer, prompt, completion, cap, self.most_rows,
                             extra=[(self.critic, self.critic_optimizer)]))
        self.budget, self.settings = budget, replace(self.settings, micro_batch_tokens=budget.budget)
        return budget.to_json()

    def cap(self) -> int:
        configured = self.rl.learner.memory_cap_mb
        device = model_device(self.policy)
        cap = memory_cap(device, configured)
        return cap if configured is not None or device.type == "cuda" else cap // self.world  # one machine's, shared

    def restore_entropy(self, state: dict) -> None:
        if self.settings.entropy is not None:
            self.settings.entropy.load(state)

    # --- what rank 0 calls on a peer, alongside its own call --------------------------------
    def ready(self) -> int:
        return self.rank

    def pid(self) -> int:
        return os.getpid()

    def update(self, batch: dict, lr: float) -> None:
        self.set_lr(lr)  # rank 0's rate, alerts' cuts included
        crash_point(f"learner{self.rank}", self.steps)
        self.steps += 1
        self.train(Experience(**batch))

    def publish(self, bucket_bytes: int) -> None:
        """Take part in bringing rank 0's serving copy up to date (a peer keeps none)."""
        self.strategy.publish(self.policy, None, bucket_bytes)

    def gather(self, which: str) -> None:
        self.strategy.full_state(self.policy if which == "policy" else self.critic, which)

    def save(self, folder: str) -> None:
        self.strategy.save_shards(folder, self.parts())

    def close(self) -> None:
        self.strategy.leave()
