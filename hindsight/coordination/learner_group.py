"""The learner group as the RL run starts it: ranks 1..P-1 as Ray actors, each a
`learning.rank.LearnerRank` built from the same sources as rank 0 (the stage's process), in one
torch.distributed group for the whole stage. Nothing is started per step."""
from __future__ import annotations

from contextlib import contextmanager

from hindsight.coordination.placement import actor_env, start_ray
from hindsight.learning.rank import LearnerRank


class LearnerGroup:
    """The handle rank 0 holds on its peers: it starts them, has them run a method alongside its
    own call (the same collectives in the same order), and stops them."""

    def __init__(self, cfg, pad_id: int, sources: dict, base: str, resume: bool):
        rl, world = cfg.rl, cfg.rl.learner.processes
        self.ray = start_ray(rl.workers.ray_address)
        self.init_method = f"tcp://{self.ray.util.get_node_ip_address()}:{_free_port()}"
        res = rl.workers.of("learner")
        peer = self.ray.remote(num_cpus=res.num_cpus, num_gpus=res.num_gpus, max_restarts=0,
                               runtime_env={"env_vars": actor_env(rl.workers)})(LearnerRank)
        # each peer joins the process group in its constructor and waits there for rank 0
        self.peers = [peer.remote(r, world, self.init_method, rl, cfg.model, sources, pad_id, cfg.seed, base, resume)
                      for r in range(1, world)]

    def wait_ready(self) -> None:
        """The peers have built what they train (after rank 0's own collectives of the start)."""
        self.ray.get([p.ready.remote() for p in self.peers])

    @contextmanager
    def alongside(self, method: str, *args):
        calls = [getattr(p, method).remote(*args) for p in self.peers]
        yield
        if calls:
            self.ray.get(calls)

    def lost_peer(self, exc: BaseException) -> bool:
        """Whether `exc`, raised in rank 0 during a group call, means a peer is gone or stuck:
        a peer actor that died, or a collective that failed on the transport (torch's DistError:
        a closed connection, or a timeout waiting for a rank that stopped)."""
        import torch.distributed as dist

        if isinstance(exc, self.ray.exceptions.RayActorError):
            return True
        return isinstance(exc, getattr(dist, "DistError", ())) or (
            isinstance(exc, RuntimeError) and any(s in str(exc) for s in _TRANSPORT_FAILURES))

    def close(self) -> None:
        for p in self.peers:
            self.ray.kill(p)
        self.peers = []


# what gloo says when a peer's socket closes or it stops answering, on torch versions whose
# collectives raise a bare RuntimeError
_TRANSPORT_FAILURES = ("Connection closed by peer", "Connection reset by peer", "Timed out waiting",
                       "Gloo connectFullMesh failed")


def start_learner_group(cfg, pad_id: int, base: str, resume: bool):
    """`Learner`'s `start_group`: the stage's learner group (rl.learner.processes ranks; this process is rank 0)."""
    return lambda sources: LearnerGroup(cfg, pad_id, sources, base, resume)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]
