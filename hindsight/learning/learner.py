"""The learning role of the RL stage, as rank 0 of the learner group: its own `LearnerRank`, the
full serving copy of the policy that the rest of the run reads (the rollout workers, evaluation,
the checkpoint's Hugging Face folder), and the handle on its peers. The coordinator hands it a
batch and gets metrics back.

Everything that differs between the learner strategies is the strategy's (`strategies`): with
`ddp` the serving copy is the trained policy itself; with `fsdp2` it is a full copy beside the
shards, refreshed from them a bucket at a time after every update.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import torch

from hindsight.errors import StageError
from hindsight.maths.experience import Experience
from hindsight.learning.algorithms import get_algorithm
from hindsight.learning.rank import LearnerRank
from hindsight.learning.strategies import get_strategy


class PeerLost(StageError):
    """A learner rank died or hung inside a collective. The machine's fault, not the input's: the
    coordinator rebuilds the group in place, and a stage that fails with it is worth a retry."""
    transient = True


class Learner:
    def __init__(self, cfg, init_path: str, rm_path: str | None, ckpt, start: int | None, pad_id: int,
                 start_group=None):
        """`start_group(sources)` starts the learner group's other ranks (Ray actors) and returns
        its handle, with the `init_method` rank 0 joins; None: this process alone."""
        rl = self.rl = cfg.rl
        world = rl.learner.processes
        strategy = get_strategy(rl.learner.strategy)
        critic_init = None
        if get_algorithm(rl.algorithm).needs_critic:  # from the reward model or the policy
            critic_init = rm_path if rl.algorithm_settings().critic_init == "reward_model" else init_path
        self.sources = strategy.sources(ckpt, start, init_path, critic_init)
        self.policy_path = self.sources["policy"]
        self.group = start_group(self.sources) if world > 1 else None
        try:
            self.rank = LearnerRank(0, world, self.group.init_method if self.group else None, rl, cfg.model,
                                    self.sources, pad_id, cfg.seed, base=init_path, resume=bool(start))
            self.serving = self.rank.strategy.serving(self.rank.policy, self.policy_path, cfg.model)
            if self.group is not None:
                self.group.wait_ready()
        except BaseException:  # a half-started group would hold its ranks and process group for the retry
            self.close()
            raise

    # what the rest of the run reads of rank 0
    @property
    def policy(self):
        return self.rank.policy

    @property
    def critic(self):
        return self.rank.critic

    @property
    def optimizer(self):
        return self.rank.optimizer

    @property
    def critic_optimizer(self):
        return self.rank.critic_optimizer

    @property
    def settings(self):
        return self.rank.settings

    def alongside(self, method: str, *args):
        """The peers run `method(*args)` while this rank runs the body: the same collectives."""
        return self.group.alongside(method, *args) if self.group is not None else nullcontext()

    def set_lr(self, lr: float) -> None:
        self.rank.set_lr(lr)

    def fit_budget(self, prompt: int, completion: int, kept: dict | None = None) -> dict:
        """`rl.learner.micro_batch_tokens: auto`: every rank fits its budget for rows of `prompt +
        completion` tokens (its probes are collectives where the strategy's backward is), or
        takes the fit a checkpoint `kept`; rank 0's fit is returned, and kept with each checkpoint."""
        with self.alongside("fit", prompt, completion, None, kept):
            return self.rank.fit(prompt, completion, None, kept)

    def restore_entropy(self, state: dict) -> None:
        """The adaptive entropy coefficient a checkpoint kept, on every rank."""
        with self.alongside("restore_entropy", state):
            self.rank.restore_entropy(state)

    @property
    def budget_fit(self) -> dict | None:
        return self.rank.budget.to_json() if self.rank.budget is not None else None

    def train(self, exp: Experience, groups: list[int]) -> dict:
        """One update on the batch; its advantages are set on `exp` (the coordinator stores them).
        Then the serving copy holds the new weights. A peer lost on the way (dead, or silent past
        the collective's timeout) raises `PeerLost`: the group, rank 0 included, is then broken."""
        try:
            return self._train(exp, groups)
        except Exception as exc:
            if self.group is None or not self.group.lost_peer(exc):
                raise
            raise PeerLost(f"the learner group lost a rank during an update: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc

    def _train(self, exp: Experience, groups: list[int]) -> dict:
        t0 = time.perf_counter()
        strategy = self.rank.strategy
        exp.meta["groups"] = groups
        strategy.prepare_batch(exp, self.settings, self.critic)
        with self.alongside("update", vars(exp), self.optimizer.param_groups[0]["lr"]):
            metrics = self.rank.train(exp)
        metrics["time/compute/learn_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        published = strategy.publish(self.policy, self.serving, int(self.rl.learner.publish_bucket_mb * 2**20),
                                     self.alongside)
        if published:
            metrics.update({**published, "time/publish_s": time.perf_counter() - t0})
        return metrics

    def full_state(self, which: str = "policy") -> dict[str, torch.Tensor]:
        """The whole state dict of the policy or critic (gathered from every rank where it is
        sharded): for inspection and tests; the run itself never holds it."""
        model = self.policy if which == "policy" else self.critic
        return self.rank.strategy.full_state(model, which, self.alongside)

    def healthy(self, max_abs: float) -> bool:
        """Every weight of the serving copy finite and within +-`max_abs`."""
        return all(bool(torch.isfinite(p).all()) and float(p.detach().abs().max()) <= max_abs
                   for p in self.serving.parameters() if p.numel())

    def save(self, ckpt, step: int, tok, extra: dict) -> None:
        self.rank.strategy.checkpoint(ckpt, step, tok, extra, self.rank, self.serving, self.alongside)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        if hasattr(self, "rank"):
            self.rank.close()
