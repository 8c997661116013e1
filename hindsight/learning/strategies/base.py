"""A learner strategy: how the ranks of the learner group hold what they train, and how they
train it together. Every rank is the same `learning.rank.LearnerRank`; the strategy it holds
owns everything that differs between variants:

- building: `build` (a sharded rank starts on the meta device), `prepare` (ranks that replicate
  take rank 0's weights), `sources` (what the ranks build and resume from);
- the gradient: it is the rank's `update.Share` (which rows it trains, the loss scale, how the
  gradients are summed, how many micro-batches a rank runs);
- state: `load` and `checkpoint` / `save_shards` (one file per checkpoint component, or a
  `torch.distributed.checkpoint` folder of shards);
- publication: `serving` (the full policy the rest of the run reads) and `publish` (new weights
  into it, a bucket at a time).

The next strategy is one class in a file of this package, decorated with `@register`, its module
named in `catalogue.BUILT_IN`; `rl.learner.strategy` then takes its name.
"""
from __future__ import annotations

import socket
import statistics
from contextlib import nullcontext
from datetime import timedelta
from typing import Callable, ClassVar

import torch

from hindsight.learning.strategies.catalogue import STRATEGIES, get_strategy, register  # noqa: F401
from hindsight.learning.update import Share


def collective_timeout_s(took: list[float], workers) -> float:
    """How long a collective waits for a peer once updates are measured: stall_factor x the
    median update (a loaded machine's slow steps raise it with them), at least collective_min_s.
    Before any, the group waits placement_timeout_s (ranks still loading their models)."""
    if not took:
        return workers.placement_timeout_s
    return max(workers.collective_min_s, workers.stall_factor * statistics.median(took))


class Strategy(Share):
    name: ClassVar[str]
    can_offload: ClassVar[bool] = False      # rl.learner.offload is meaningful
    trains_adapters: ClassVar[bool] = True   # rl.lora trains under it
    always_grouped: ClassVar[bool] = False   # needs a process group even alone (FSDP2 does)

    def __init__(self, rank: int, world: int, learner_cfg):
        self.rank, self.world, self.cfg = rank, world, learner_cfg

    # --- the process group --------------------------------------------------------------
    @classmethod
    def grouped(cls, world: int) -> bool:
        return world > 1 or cls.always_grouped

    def join(self, init_method: str | None, timeout_s: float) -> None:
        """Join the group's one torch.distributed process group (NCCL between GPUs, gloo on a
        CPU). A collective a dead rank never joins fails after `timeout_s`, and the stage with
        it, instead of hanging for gloo's 30 minutes."""
        if not self.grouped(self.world):
            return
        import torch.distributed as dist

        if dist.is_initialized():  # left by an earlier attempt of this stage in this process that failed
            dist.destroy_process_group()
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                init_method=init_method or local_init_method(), rank=self.rank,
                                world_size=self.world, timeout=timedelta(seconds=timeout_s))

    def set_timeout(self, timeout_s: float) -> None:
        """How long a collective waits for a peer from now on (`collective_timeout_s`)."""
        if self.grouped(self.world):
            from torch.distributed.distributed_c10d import _set_pg_timeout

            _set_pg_timeout(timedelta(seconds=timeout_s))

    def leave(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    # --- building -----------------------------------------------------------------------
    @classmethod
    def sources(cls, ckpt, start: int | None, policy: str, critic: str | None) -> dict:
        """What every rank builds from: the policy's and the critic's folders, and the resume state."""
        raise NotImplementedError

    @classmethod
    def check_resume(cls, ckpt, start: int | None) -> None:
        """Refuse, before anything is written, a checkpoint this strategy cannot resume from (one
        another strategy wrote)."""

    def build(self, make: Callable[..., torch.nn.Module], path: str) -> torch.nn.Module:
        """The model `make(path)` builds, as this rank holds it."""
        return make(path)

    def prepare(self, *models) -> None:
        """After every rank has built: make the ranks' models the same where they must be."""

    def prepare_batch(self, exp, settings, critic) -> None:
        """Rank 0, before the batch goes to the peers: what only it computes."""

    def load(self, sources: dict, parts: dict[str, tuple]) -> None:
        """Read the resume state (`sources`) into each (model, optimizer) of `parts`."""
        raise NotImplementedError

    # --- state --------------------------------------------------------------------------
    def checkpoint(self, ckpt, step: int, tok, extra: dict, rank, serving, alongside) -> None:
        """Rank 0 writes step `step`'s checkpoint; `alongside(method, *args)` has the peers join."""
        raise NotImplementedError

    def save_shards(self, folder: str, parts: dict[str, tuple]) -> None:
        """A peer's part of `checkpoint` (nothing, for a strategy whose rank 0 holds everything)."""

    # --- publication --------------------------------------------------------------------
    def serving(self, policy, path: str, model_cfg):
        """The full policy the rollout workers, evaluation and checkpoints read (rank 0)."""
        return policy

    def publish(self, policy, serving, bucket_bytes: int, alongside=None) -> dict[str, float]:
        """Bring `serving` up to the trained `policy` (every rank calls it; `serving` is None on
        the peers). Returns what it measured."""
        return {}

    def full_state(self, model, which: str, alongside=None) -> dict[str, torch.Tensor]:
        """The whole state dict of a trained model, `which` is "policy" or "critic" (for
        inspection and tests)."""
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


def local_init_method() -> str:
    """A rendezvous on loopback, for a group of one."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def peers_join(alongside):
    """`alongside` or, for a rank without peers, nothing to join."""
    return alongside or (lambda *_: nullcontext())
