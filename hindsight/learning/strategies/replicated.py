"""`ddp`: every rank holds the whole policy, critic and Adam state. Rank 0's weights are
broadcast at the start and every rank reads the same optimizer state, so the ranks stay equal;
each step every rank trains its groups of each mini-batch and the gradients are summed in one
flattened all-reduce (made explicit rather than DDP's, so that PPO's critic, read past the
model's forward, syncs the same way)."""
from __future__ import annotations

import torch

from hindsight.errors import CheckpointError
from hindsight.learning.strategies.base import Strategy, register
from hindsight.learning.update import whole_batch_advantages
from hindsight.state.checkpoint import load_tensor_file


@register
class Replicated(Strategy):
    name = "ddp"

    @classmethod
    def sources(cls, ckpt, start: int | None, policy: str, critic: str | None) -> dict:
        """On resume the checkpoint's own folders (policy, critic) and optimizer files."""
        if not start:
            return {"policy": policy, "critic": critic}
        cls.check_resume(ckpt, start)
        out = {"policy": str(ckpt.policy_dir(start)), "optimizer": str(ckpt.tensor_file(start)),
               "critic": str(ckpt.critic_dir(start)) if critic is not None else None}
        if critic is not None:
            out["critic_optimizer"] = str(ckpt.tensor_file(start, "critic_optimizer"))
        return out

    @classmethod
    def check_resume(cls, ckpt, start: int | None) -> None:
        if start and not ckpt.tensor_file(start).exists() and ckpt.learner_state_dir(start).is_dir():
            raise CheckpointError(f"{ckpt.root}: step {start} was saved by a sharded learner (its state is under "
                                  f"learner_state/, not one optimizer file); resume with rl.learner.strategy: fsdp2, "
                                  f"or rerun with --force to start over")

    def prepare(self, *models) -> None:
        if self.world == 1:
            return
        import torch.distributed as dist

        for model in models:
            if model is not None:
                for p in model.parameters():
                    dist.broadcast(p.data, 0)

    def prepare_batch(self, exp, settings, critic) -> None:
        """The advantages (and a critic's values) once, on rank 0, before any rank takes its share."""
        whole_batch_advantages(exp, settings, critic)

    def load(self, sources: dict, parts: dict[str, tuple]) -> None:
        for name, (_, optimizer) in parts.items():
            file = sources.get("optimizer" if name == "policy" else f"{name}_optimizer")
            if file:
                optimizer.load_state_dict(load_tensor_file(file))

    def checkpoint(self, ckpt, step: int, tok, extra: dict, rank, serving, alongside) -> None:
        ckpt.save(step, rank.policy, tok, rank.optimizer, extra, rank.critic, rank.critic_optimizer)

    def sync(self, params) -> None:
        if self.world == 1:
            return
        import torch.distributed as dist

        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:  # a parameter this share did not reach still takes part in the sum
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])                  # (N,)
        dist.all_reduce(flat)
        at = 0
        for p in params:
            p.grad.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()
