"""The learner group: P processes in one torch.distributed group (gloo on a CPU, NCCL between
GPUs) for the whole stage.

Rank 0 is the stage's own process (`learner.Learner`); ranks 1..P-1 are `LearnerPeer`s (Ray
actors), built from the same files. Every step each rank trains on its groups of each
mini-batch, with the advantages (and a critic's values and returns) of the whole batch, and
the ranks' gradients add up to the one-process gradient (`update.Share`). Nothing is started
per step. Two strategies (`rl.workers.learner_strategy`):

- ddp: every rank holds the whole policy, critic and Adam state (rank 0's weights broadcast at
  the start, the same optimizer state read from the same checkpoint).
- fsdp2: each rank holds its shard of them (`sharding`); every forward, the weights'
  publication and the checkpoint are collectives that all ranks run in step, which is why
  rank 0 asks the peers to `publish`, `save` and `gather` alongside its own call.
"""
from __future__ import annotations

import torch

from hindsight.experience import Experience
from hindsight.faults import crash_point
from hindsight.learning import sharding
from hindsight.learning.update import Share, learner_settings, update


def group_timeout(rl):
    """A collective a dead rank never joins fails after this, and the stage with it (then
    Prefect's retry resumes from the newest checkpoint), instead of hanging for gloo's 30 minutes."""
    from datetime import timedelta

    return timedelta(seconds=rl.workers.lease_ttl_s)


def process_group_backend() -> str:
    """NCCL between GPUs, gloo on a CPU."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def broadcast_from_rank0(*models) -> None:
    """Every rank starts from rank 0's weights (all ranks call this, in the same order)."""
    import torch.distributed as dist

    for model in models:
        if model is not None:
            for p in model.parameters():
                dist.broadcast(p.data, 0)


class LearnerPeer:
    """Learner rank > 0: built from files in its own process, then trained in step with rank 0."""

    def __init__(self, rank: int, world: int, init_method: str, rl, model_cfg, files: dict, pad_id: int, seed: int):
        import torch.distributed as dist

        from hindsight.learning.build import build_critic, build_optimizer, build_policy

        dist.init_process_group(process_group_backend(), init_method=init_method, rank=rank, world_size=world,
                                timeout=group_timeout(rl))
        self.rank, self.world, self.settings, self.steps = rank, world, learner_settings(rl), 0
        self.sharded = rl.workers.learner_strategy == "fsdp2"
        offload = rl.workers.learner_offload
        self.policy = build_policy(files["policy"], model_cfg, rl)
        self.critic = self.critic_optimizer = None
        if files.get("critic") is not None:
            self.critic = build_critic(files["critic"], model_cfg, rl, pad_id, seed)
        if self.sharded:
            self.policy = sharding.shard(self.policy, offload, self.policy.compute_dtype)
            if self.critic is not None:
                self.critic = sharding.shard(self.critic, offload, self.critic.compute_dtype)
        self.optimizer = build_optimizer(self.policy, rl.lr, files.get("optimizer"))
        if self.critic is not None:
            self.critic_optimizer = build_optimizer(self.critic, self.settings.algorithm_settings.critic_lr,
                                                    files.get("critic_optimizer"))
        if self.sharded and files.get("learner_state"):
            sharding.load_state(files["learner_state"], self.parts())
        elif not self.sharded:
            broadcast_from_rank0(self.policy, self.critic)

    def parts(self) -> dict[str, tuple]:
        parts = {"policy": (self.policy, self.optimizer)}
        if self.critic is not None:
            parts["critic"] = (self.critic, self.critic_optimizer)
        return parts

    def ready(self) -> int:
        return self.rank

    def pid(self) -> int:
        import os

        return os.getpid()

    def update(self, batch: dict, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr  # rank 0's rate, alerts' cuts included
        exp = Experience(**batch)
        crash_point(f"learner{self.rank}", self.steps)
        self.steps += 1
        update(self.policy, self.optimizer, exp, self.settings, self.critic, self.critic_optimizer,
               share=Share(rank=self.rank, world=self.world, sharded=self.sharded))

    def publish(self, bucket_bytes: int) -> None:
        """Take part in gathering the weights for rank 0's rollout copy (this rank keeps none)."""
        sharding.publish(self.policy, None, bucket_bytes)

    def gather(self, which: str) -> None:
        for _ in sharding.full_buckets(self.policy if which == "policy" else self.critic, 2**30):
            pass

    def save(self, folder: str) -> None:
        sharding.save_state(folder, self.parts())

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
