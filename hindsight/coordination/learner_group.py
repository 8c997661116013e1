"""The learner group as the RL run starts it: ranks 1..P-1 as Ray actors (`learning.group.LearnerPeer`)
around this process, rank 0, in one torch.distributed group for the whole stage."""
from __future__ import annotations

from contextlib import contextmanager

from hindsight.coordination.placement import actor_env, start_ray
from hindsight.learning.group import LearnerPeer, broadcast_from_rank0, group_timeout, process_group_backend


class LearnerGroup:
    """Learner ranks 1..P-1 as Ray actors; this process is rank 0 (see `hindsight.learning.group`).
    A sharded learner of one process is a group of one: FSDP2 needs its process group."""

    def __init__(self, world: int, rl, files: dict, model_cfg, pad_id: int, seed: int, policy, critic):
        import torch.distributed as dist

        self.world, self.sharded = world, rl.workers.learner_strategy == "fsdp2"
        self.ray = start_ray(rl.workers.ray_address) if world > 1 else None
        host = self.ray.util.get_node_ip_address() if self.ray else "127.0.0.1"
        init = f"tcp://{host}:{_free_port()}"
        self.peers = []
        if world > 1:
            res = rl.workers.of("learner")
            peer = self.ray.remote(num_cpus=res.num_cpus, num_gpus=res.num_gpus, max_restarts=0,
                                   runtime_env={"env_vars": actor_env(rl.workers)})(LearnerPeer)
            self.peers = [peer.remote(r, world, init, rl, model_cfg, files, pad_id, seed) for r in range(1, world)]
        if dist.is_initialized():  # left by an earlier attempt of this stage in this process that failed
            dist.destroy_process_group()
        try:
            dist.init_process_group(process_group_backend(), init_method=init, rank=0, world_size=world,
                                    timeout=group_timeout(rl))
            if not self.sharded:
                broadcast_from_rank0(policy, critic)
        except BaseException:
            self.close()
            raise

    def wait_ready(self) -> None:
        """The peers have built what they train (after rank 0's own collectives of the start)."""
        if self.peers:
            self.ray.get([p.ready.remote() for p in self.peers])

    @contextmanager
    def alongside(self, method: str, *args):
        """The peers run `method(*args)` while this rank runs the body: the same collectives."""
        calls = [getattr(p, method).remote(*args) for p in self.peers]
        yield
        if calls:
            self.ray.get(calls)

    def update(self, exp, groups: list[int], learner) -> dict:
        """Every rank trains on its share of the batch; returns rank 0's metrics. A replicated
        rank 0 computes the advantages (and the critic's values) first; sharded ranks compute
        them together, the critic's forward being a collective."""
        from hindsight.learning.update import Share, update, whole_batch_advantages

        if not self.sharded:
            whole_batch_advantages(exp, learner.settings, learner.critic)
        exp.meta["groups"] = groups
        lr = learner.optimizer.param_groups[0]["lr"]
        with self.alongside("update", vars(exp), lr):
            return update(learner.policy, learner.optimizer, exp, learner.settings, learner.critic,
                          learner.critic_optimizer, share=Share(rank=0, world=self.world, sharded=self.sharded))

    def close(self) -> None:
        import torch.distributed as dist

        for p in self.peers:
            self.ray.kill(p)
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
