"""The learning role of the RL stage: the policy it trains, its optimizer, the critic of an
algorithm that has one, and how a batch is trained (in this process, or over the learner group).
The coordinator hands it a batch and gets metrics back.

With `rl.workers.learner_strategy: fsdp2` the trained policy and critic are sharded over the
group (`sharding`), so this rank cannot run them alone: what the rest of the run reads (the
rollout workers, evaluation, the checkpoint's Hugging Face folder) is `serving`, one full copy
that every update refreshes from the shards a bucket at a time. Otherwise `serving` is the
trained policy itself.
"""
from __future__ import annotations

import time

import torch

from hindsight.experience import Experience
from hindsight.learning import sharding
from hindsight.learning.build import build_critic, build_optimizer, build_policy
from hindsight.learning.update import learner_settings, update, whole_batch_advantages
from hindsight.models.load import load_causal_lm


class Learner:
    def __init__(self, cfg, init_path: str, rm_path: str | None, ckpt, start: int | None, pad_id: int,
                 start_group=None):
        """`start_group(files, policy, critic)` starts the learner group's other ranks (None: this
        process alone); they build what they train from `files` (`resume_files`)."""
        rl, model_cfg = cfg.rl, cfg.model
        self.rl, self.cfg, self.settings = rl, cfg, learner_settings(rl)
        self.sharded = rl.workers.learner_strategy == "fsdp2"
        self.policy_path = str(ckpt.policy_dir(start)) if start else init_path
        self.policy = build_policy(self.policy_path, model_cfg, rl, base=init_path, seed=cfg.seed, resume=bool(start))
        self.critic = self.critic_optimizer = self.critic_source = None
        if self.settings.estimator.needs_critic:
            p = self.settings.algorithm_settings  # from the checkpoint on resume, else the reward model or the policy
            self.critic_source = self._critic_source(ckpt, start, init_path, rm_path, p.critic_init)
            self.critic = build_critic(self.critic_source, model_cfg, rl, pad_id, cfg.seed)
        self._serving = None
        self.group = None
        try:
            self._prepare(ckpt, start, start_group)
        except BaseException:  # a half-started group would hold the process group for the retry
            self.close()
            raise

    def _prepare(self, ckpt, start: int | None, start_group) -> None:
        """Shard (fsdp2) or start the peers from rank 0's weights (ddp), build the optimizers and
        read the resume state."""
        rl, files = self.rl, self.resume_files(ckpt, start)
        if self.sharded:  # every rank shards the same full model, then reads its shard of the state
            self._serving = serving_copy(self.policy_path, self.cfg.model)
            self.group = start_group(files, self.policy, self.critic)
            self.policy = sharding.shard(self.policy, rl.workers.learner_offload, self.policy.compute_dtype)
            if self.critic is not None:
                self.critic = sharding.shard(self.critic, rl.workers.learner_offload, self.critic.compute_dtype)
        self.optimizer = build_optimizer(self.policy, rl.lr)
        if self.critic is not None:
            self.critic_optimizer = build_optimizer(self.critic, self.settings.algorithm_settings.critic_lr)
        if start and self.sharded:
            sharding.load_state(ckpt.learner_state_dir(start), self.parts())
        elif start:
            ckpt.load_optimizer(start, self.optimizer)
            if self.critic is not None:
                ckpt.load_optimizer(start, self.critic_optimizer, "critic_optimizer")
        if not self.sharded and rl.workers.learner > 1:
            self.group = start_group(files, self.policy, self.critic)  # the peers take rank 0's weights
        if self.group is not None:
            self.group.wait_ready()

    def _critic_source(self, ckpt, start, init_path: str, rm_path: str | None, critic_init: str) -> str:
        """A replicated critic resumes from its checkpoint folder; a sharded one is built from
        where it started, then its weights come from the sharded state."""
        if start and not self.sharded:
            return str(ckpt.critic_dir(start))
        return rm_path if critic_init == "reward_model" else init_path

    @property
    def serving(self):
        """The full policy the rollout workers, evaluation and checkpoints read."""
        return self._serving if self._serving is not None else self.policy

    def parts(self) -> dict[str, tuple]:
        """What a sharded checkpoint holds: each trained model with its optimizer."""
        parts = {"policy": (self.policy, self.optimizer)}
        if self.critic is not None:
            parts["critic"] = (self.critic, self.critic_optimizer)
        return parts

    def resume_files(self, ckpt, start: int | None) -> dict:
        """What the other ranks of a learner group build from: this rank's sources and state."""
        paths = {"policy": self.policy_path, "critic": self.critic_source}
        if start and self.sharded:
            paths["learner_state"] = str(ckpt.learner_state_dir(start))
        elif start:
            paths["optimizer"] = str(ckpt.tensor_file(start))
            if self.critic is not None:
                paths["critic_optimizer"] = str(ckpt.tensor_file(start, "critic_optimizer"))
        return paths

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def train(self, exp: Experience, groups: list[int]) -> dict:
        """One update on the batch; its advantages are set on `exp` (the coordinator stores them)."""
        t0 = time.perf_counter()
        if self.group is not None:
            metrics = self.group.update(exp, groups, self)
        else:
            whole_batch_advantages(exp, self.settings, self.critic)
            metrics = update(self.policy, self.optimizer, exp, self.settings, self.critic, self.critic_optimizer)
        metrics["time/compute/learn_s"] = time.perf_counter() - t0
        if self.sharded:
            metrics.update(self._refresh_serving())
        return metrics

    def _refresh_serving(self) -> dict:
        """The new weights gathered from the shards into `serving`, a bucket at a time."""
        t0 = time.perf_counter()
        bucket = int(self.rl.workers.publish_bucket_mb * 2**20)
        with self.group.alongside("publish", bucket):
            stats = sharding.publish(self.policy, self._serving, bucket)
        return {**stats, "time/publish_s": time.perf_counter() - t0}

    def full_state(self, which: str = "policy") -> dict[str, torch.Tensor]:
        """The whole state dict of the policy or critic on this rank (a sharded one is gathered
        from every rank): for inspection and tests; the run itself never holds it."""
        model = self.policy if which == "policy" else self.critic
        if not self.sharded:
            return {k: v.detach().clone() for k, v in model.state_dict().items()}
        out: dict[str, torch.Tensor] = {}
        with self.group.alongside("gather", which):
            for bucket in sharding.full_buckets(model, 2**30):
                out.update(bucket)
        return {**out, **{alias: out[name] for alias, name in sharding.aliases(model).items()}}

    def finite(self) -> bool:
        return all(bool(torch.isfinite(p).all()) for p in self.serving.parameters())

    def save(self, ckpt, step: int, tok, extra: dict) -> None:
        if not self.sharded:
            ckpt.save(step, self.policy, tok, self.optimizer, extra, self.critic, self.critic_optimizer)
            return

        def write_state(folder) -> None:  # each rank writes its shard into the same folder
            with self.group.alongside("save", str(folder)):
                sharding.save_state(folder, self.parts())

        ckpt.save(step, self.serving, tok, extra=extra, sharded_state=write_state)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()


def serving_copy(path: str, model_cfg):
    """The full policy beside a sharded learner, in the run's dtype; it only runs forwards."""
    model = load_causal_lm(path, model_cfg.dtype).eval()
    model.compute_dtype = getattr(torch, model_cfg.dtype)
    for p in model.parameters():
        p.requires_grad_(False)
    return model
