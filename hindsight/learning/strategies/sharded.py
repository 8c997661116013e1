"""`fsdp2`: each rank keeps 1/P of the weights, gradients and Adam state (FSDP2's `fully_shard`),
so a model too big for one device trains over several.

What differs from a replicated learner, and why each piece is here:
- one FSDP unit per decoder layer (the model's own `_no_split_modules`), then the root, so a
  forward holds one layer's full weights at a time; bf16 compute all-gathers the weights in
  that dtype while the optimizer keeps fp32 masters (`MixedPrecisionPolicy`);
- a rank starts on the meta device and reads only its own slices of the checkpoint (`meta_start`);
- every forward is a collective, so every rank runs the same number of micro-batches (`most`,
  zero-weighted stand-ins), a critic's values are computed by all ranks and rank 0's kept
  (`agree`), and the model says so to the shared-prompt path, which would run a different number
  of forwards on different ranks (`COLLECTIVE_FORWARD`);
- FSDP2 averages gradients over the ranks (gloo has no pre-multiplied sum), so a rank's loss is
  multiplied by the world size (`grad_scale`) to keep the sum of the ranks' parts;
- the full weights are gathered a bucket at a time on all ranks at once (only rank 0 keeps them,
  in its serving copy), and the resume state is `torch.distributed.checkpoint` shards.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from hindsight.buckets import by_size, nbytes
from hindsight.errors import CheckpointError
from hindsight.learning.strategies.base import Strategy, peers_join, register
from hindsight.learning.strategies.meta_start import can_start_on_meta, materialize
from hindsight.maths.logprobs import COLLECTIVE_FORWARD
from hindsight.models.load import FRESH, default_device, load_causal_lm


@register
class Sharded(Strategy):
    name = "fsdp2"
    can_offload = True
    trains_adapters = False
    always_grouped = True  # FSDP2 needs a process group even for one rank

    @classmethod
    def sources(cls, ckpt, start: int | None, policy: str, critic: str | None) -> dict:
        """The folders the models are built from (on resume, the checkpoint's consolidated policy),
        and the shards of the resume state."""
        if not start:
            return {"policy": policy, "critic": critic}
        cls.check_resume(ckpt, start)
        return {"policy": str(ckpt.policy_dir(start)), "critic": critic,
                "learner_state": str(ckpt.learner_state_dir(start))}

    @classmethod
    def check_resume(cls, ckpt, start: int | None) -> None:
        if start and not ckpt.learner_state_dir(start).is_dir():
            raise CheckpointError(f"{ckpt.root}: step {start} was saved by a learner that is not sharded (its "
                                  f"optimizer state is one file, not learner_state/ shards); resume with "
                                  f"rl.learner.strategy: ddp, or rerun with --force to start over")

    # --- building -----------------------------------------------------------------------
    def build(self, make, path: str):
        if not can_start_on_meta(path):
            return self._shard(make(path))
        model = make(path, empty=True)
        fresh = getattr(model, FRESH, None) or {}
        self._shard(model)
        device = torch.device("cpu") if self.cfg.offload else default_device()
        materialize(model, path, device, fresh, tensors)
        return model

    def _shard(self, model):
        return shard(model, self.cfg.offload, getattr(model, "compute_dtype", torch.float32))

    def load(self, sources: dict, parts: dict[str, tuple]) -> None:
        """Every rank reads its shard of each part (any world size can read the folder)."""
        if not sources.get("learner_state"):
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = state_parts(parts)
        dcp.load(state, checkpoint_id=sources["learner_state"])
        for name, (model, optimizer) in parts.items():
            set_state_dict(model, optimizer, model_state_dict=state[f"{name}/model"],
                           optim_state_dict=state[f"{name}/optimizer"])

    # --- the gradient (update.Share) ------------------------------------------------------
    @property
    def grad_scale(self) -> float:
        return float(self.world)

    def most(self, n: int) -> int:
        if self.world == 1:
            return n
        import torch.distributed as dist

        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def agree(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            import torch.distributed as dist

            dist.broadcast(t, 0)
        return t

    # --- state --------------------------------------------------------------------------
    def checkpoint(self, ckpt, step: int, tok, extra: dict, rank, serving, alongside) -> None:
        """The consolidated serving copy as the policy folder, every rank's shards in one DCP folder."""
        def write_state(folder) -> None:
            with peers_join(alongside)("save", str(folder)):
                self.save_shards(str(folder), rank.parts())

        ckpt.save(step, serving, tok, extra=extra, state_writer=write_state)

    def save_shards(self, folder: str, parts: dict[str, tuple]) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(state_parts(parts), checkpoint_id=folder)

    # --- publication --------------------------------------------------------------------
    def serving(self, policy, path: str, model_cfg):
        """A full copy in the run's dtype beside the shards; it only runs forwards."""
        model = load_causal_lm(path, model_cfg.dtype).eval()
        model.compute_dtype = getattr(torch, model_cfg.dtype)
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    def publish(self, policy, serving, bucket_bytes: int, alongside=None) -> dict[str, float]:
        with peers_join(alongside)("publish", bucket_bytes):
            return publish(policy, serving, bucket_bytes)

    def full_state(self, model, which: str, alongside=None) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        with peers_join(alongside)("gather", which):
            for bucket in full_buckets(model, 2**30):
                out.update(bucket)
        return {**out, **{alias: out[name] for alias, name in aliases(model).items()}}


def shard(model, offload: bool = False, compute_dtype: torch.dtype = torch.float32):
    """Shard `model` in place over the default process group and return it: one FSDP unit per
    decoder layer, then the root. offload: parameters, gradients and optimizer state live on the
    CPU between uses (`CPUOffloadPolicy`); the step runs there, the forwards on the device."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs = {}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    if compute_dtype != torch.float32:  # the masters stay fp32; gradients are reduced in fp32
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    setattr(model, COLLECTIVE_FORWARD, True)
    return model


def publish(model, receiver, bucket_bytes: int) -> dict[str, float]:
    """Gather the sharded `model` into the full `receiver` a bucket at a time (every rank calls
    it; `receiver` is None on ranks that only take part in the gathers)."""
    targets = dict(tensors(receiver)) if receiver is not None else None
    buckets = largest = 0
    for bucket in full_buckets(model, bucket_bytes):
        if targets is not None:
            copy_into(receiver, bucket, targets)
        buckets += 1
        largest = max(largest, sum(nbytes(t) for t in bucket.values()))
        del bucket
    return {"publish/buckets": float(buckets), "publish/largest_bucket_mb": largest / 2**20}


def decoder_layers(model) -> list[torch.nn.Module]:
    """The modules a model's authors say must not be split (its decoder layers), outermost first."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names and hasattr(model, "get_base_model"):
        names = set(model.get_base_model()._no_split_modules or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise TypeError(f"{type(model).__name__}: no decoder layers to shard (its _no_split_modules is empty)")
    return layers


def tensors(model) -> list[tuple[str, torch.Tensor]]:
    """Parameters (tied ones once) and persistent buffers, by their state-dict names."""
    persistent = set(model.state_dict(keep_vars=True))
    return [*model.named_parameters(), *((n, b) for n, b in model.named_buffers() if n in persistent)]


def aliases(model) -> dict[str, str]:
    """State-dict names that are another tensor's (tied weights: lm_head -> embed_tokens)."""
    canonical = {id(t): n for n, t in tensors(model)}
    return {n: canonical[id(t)] for n, t in model.state_dict(keep_vars=True).items()
            if id(t) in canonical and canonical[id(t)] != n}


def full_buckets(model, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """The model's full weights, a bucket of about `bucket_bytes` at a time (one tensor larger
    than a bucket is a bucket of its own). Every rank must iterate it in step: each tensor is
    all-gathered from the shards. A bucket is dropped by the caller before the next is
    gathered, so a rank holds at most one bucket of gathered weights, plus the all-gather's own
    buffer for the tensor in flight (tests/roles/test_publish_memory.py measures it)."""
    from torch.distributed.tensor import DTensor

    for bucket in by_size(tensors(model), bucket_bytes):  # cut by the DTensors' global sizes
        yield {name: (t.full_tensor() if isinstance(t, DTensor) else t).detach() for name, t in bucket}


def copy_into(receiver, bucket: dict[str, torch.Tensor], targets: dict[str, torch.Tensor] | None = None) -> None:
    """Copy a bucket of full weights into the same-named tensors of a full model, in place."""
    targets = targets if targets is not None else dict(tensors(receiver))
    with torch.no_grad():
        for name, value in bucket.items():
            if name not in targets:
                raise KeyError(f"{type(receiver).__name__} has no tensor {name}: the learner and the rollout model "
                               f"are not the same architecture")
            targets[name].copy_(value)


def state_parts(parts: dict[str, tuple]) -> dict:
    """The sharded state of each (model, optimizer) pair, as DCP saves and loads it."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out = {}
    for name, (model, optimizer) in parts.items():
        out[f"{name}/model"], out[f"{name}/optimizer"] = get_state_dict(model, optimizer)
    return out
