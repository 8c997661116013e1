"""The learner group: P processes in one torch.distributed group (gloo on a CPU) for the whole stage.

Rank 0 is the stage's own process: it holds the policy that the rollout workers, evaluation
and checkpoints use. Ranks 1..P-1 (`LearnerPeer`, Ray actors) hold identical copies: the same
weights (broadcast from rank 0 at the start), the same optimizer state (read from the same
checkpoint). Every step rank 0 computes the advantages, and the critic's values and returns,
on the whole batch (`update.whole_batch_advantages`); each rank trains on its groups of each
mini-batch, and the gradients are summed over the group (`update.Share`), so every rank takes
the same step. Nothing is started per step.
"""
from __future__ import annotations

import torch

from hindsight.experience import Experience
from hindsight.faults import crash_point
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

    def __init__(self, rank: int, world: int, init_method: str, rl, policy_path: str, model_cfg,
                 optimizer_file: str | None, critic_path: str | None, critic_optimizer_file: str | None,
                 pad_id: int, seed: int):
        import torch.distributed as dist

        from hindsight.learning.build import build_critic, build_optimizer, build_policy

        dist.init_process_group(process_group_backend(), init_method=init_method, rank=rank, world_size=world,
                                timeout=group_timeout(rl))
        self.rank, self.world, self.settings, self.steps = rank, world, learner_settings(rl), 0
        self.policy = build_policy(policy_path, model_cfg, rl)
        self.optimizer = build_optimizer(self.policy, rl.lr, optimizer_file)
        self.critic = self.critic_optimizer = None
        if critic_path is not None:
            self.critic = build_critic(critic_path, model_cfg, rl, pad_id, seed)
            self.critic_optimizer = build_optimizer(self.critic, self.settings.algorithm_settings.critic_lr,
                                                    critic_optimizer_file)
        broadcast_from_rank0(self.policy, self.critic)

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
               share=Share(rank=self.rank, world=self.world))

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
