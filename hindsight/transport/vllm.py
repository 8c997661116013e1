"""vLLM: weights pushed into a resident engine by the names of the methods hindsight adds to
vLLM's worker (`rollout.engines.vllm_weights`), through `LLM.collective_rpc`, as safetensors
bytes (vLLM decodes an RPC's arguments untyped, so tensors would not arrive as tensors).

The first version, every `full_every`-th and any the engine refused go whole, a bucket of
(name, CPU tensor) pairs at a time, each with its checksum and acked with the number of tensors
loaded; the engine then holds that version. Every other version is a delta against it
(`transport.delta`): only the elements whose bits changed in the serving dtype, in one call. The
engine checks its checksum and base version; a refusal is answered with the full copy at once,
before anything is sampled, so the engine never serves mixed weights.

Then, with `check`, the engine is checked against the learner, two ways, and a mismatch stops
the run, naming the version:
- exactly: every engine parameter that keeps its checkpoint form (on a GPU all of them; vLLM's
  fused qkv and gate_up are compared in that layout) is fingerprinted inside the engine and
  compared bit for bit with the learner's tensors (`transport.fingerprint`);
- by a probe: the engine's log-probs of a fixed token sequence against the learner's forward, their
  mean gap within `probe_tolerance` (the mean: a 16-bit engine's largest gap on a random token
  can be several tenths, while a wrong push moves every token). On a CPU vLLM hands its linear layers' weights to oneDNN
  and keeps no readable copy, so there the probe is what checks them."""
from __future__ import annotations

import torch

from hindsight.buckets import by_size
from hindsight.errors import StageError
from hindsight.transport.base import WeightSender
from hindsight.transport.delta import Publication
from hindsight.transport.fingerprint import layout_fingerprints
from hindsight.transport.payload import WeightVersion, checksum, tensor_bytes


class EngineWeightsDiffer(StageError):
    """The engine's weights after a push are not the learner's."""


class VLLMSender(WeightSender):
    def __init__(self, llm, bucket_bytes: int, weights_of, publication: Publication | None = None,
                 probe=None, probe_tolerance: float = 1e-3):
        """`weights_of(model)`: the (name, tensor) pairs the engine loads (a LoRA policy's merged
        weights); `publication` in the engine's dtype (what a delta is taken in); `probe(ids)`: the
        engine's log-prob of each of ids[1:], or None for no check after a version."""
        self.llm, self.bucket_bytes, self.weights_of = llm, bucket_bytes, weights_of
        self.publication = publication or Publication()
        self.probe, self.probe_tolerance = probe, probe_tolerance
        self.layout = None  # the engine's layout, read once after the first full copy

    def publish(self, version: int, model) -> dict[str, float]:
        payload = self.publication.next(version, dict(self.weights_of(model)))
        sent, refused = payload.nbytes, 0
        if payload.base is None:
            self._send_full(payload)
        else:
            why = [w for w in self.llm.collective_rpc("hindsight_apply_delta", args=(
                payload.version, payload.base, payload.sha256, tensor_bytes(payload.tensors))) if w]
            if why:  # a torn delta, or an engine that missed a version: the full copy, now
                full = self.publication.full()
                self._send_full(full)
                sent, refused = sent + full.nbytes, len(why)
        self.llm.reset_prefix_cache()
        metrics = {"publish/bytes": float(sent), "publish/delta": float(payload.base is not None),
                   "publish/resent_full": float(refused)}
        return {**metrics, **(self.verify(version, model) if self.probe is not None else {})}

    def verify(self, version: int, model) -> dict[str, float]:
        """Check the engine's weights against `model`'s (see the module's docstring); raises
        `EngineWeightsDiffer` naming the version."""
        exact = self.exact_check(version) if self.publication.dtype is not None else 0  # quantized: no exact layout
        gaps = probe_gaps(model, self.probe)                                               # (L-1,)
        mean = float(gaps.mean())
        if not mean <= self.probe_tolerance:  # NaN fails too
            raise EngineWeightsDiffer(
                f"weights version {version}: the vLLM engine's log-probs on the probe differ from the learner's by "
                f"{mean:.3g} on average (rl.rollout.vllm.probe_tolerance: {self.probe_tolerance:g}): its weights "
                f"are not the learner's, and the run stops rather than sample from weights it did not train")
        return {"publish/exact_tensors": float(exact), "publish/probe_gap": mean,
                "publish/probe_max_gap": float(gaps.max())}

    def exact_check(self, version: int) -> int:
        """Fingerprint, inside the engine, every parameter that keeps its checkpoint layout and
        compare it with the learner's tensors in that layout; returns how many were compared."""
        if self.layout is None:
            self.layout = self.llm.collective_rpc("hindsight_layout")[0]
        checked = [entry for entry in self.layout if entry[1]]
        want = layout_fingerprints(self.publication.held, checked)
        for got in self.llm.collective_rpc("hindsight_fingerprints", args=(checked,)):
            wrong = sorted(name for name in want if got.get(name) != want[name])
            if wrong:
                raise EngineWeightsDiffer(
                    f"weights version {version}: the vLLM engine's weights differ from the learner's in "
                    f"{len(wrong)} of {len(want)} tensors ({', '.join(wrong[:3])}{', ...' if len(wrong) > 3 else ''})"
                    ": the run stops rather than sample from weights it did not train")
        return len(checked)

    def _send_full(self, payload: WeightVersion) -> None:
        for bucket in weight_buckets(list(payload.tensors.items()), self.bucket_bytes):
            tensors = dict(bucket)
            loaded = self.llm.collective_rpc("hindsight_load_weights", args=(tensor_bytes(tensors), checksum(tensors)))
            if any(n != len(bucket) for n in loaded):
                raise StageError(f"vLLM loaded {loaded} of {len(bucket)} tensors of weights version {payload.version}"
                                 " (-1: the bucket failed its checksum)")
        self.llm.collective_rpc("hindsight_hold_version", args=(payload.version,))

    def close(self) -> None:
        self.publication.held = None


def weight_buckets(weights: list[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
    """(name, tensor) pairs as CPU tensors in buckets of about `bucket_bytes` (`buckets.by_size`),
    the arguments of one `collective_rpc` each."""
    return [[(name, w.detach().to("cpu").contiguous()) for name, w in bucket] for bucket in by_size(weights, bucket_bytes)]


PROBE_TOKENS = 48


def probe_ids(vocab_size: int, n: int = PROBE_TOKENS) -> list[int]:
    """A fixed token sequence, the same every version and run."""
    gen = torch.Generator().manual_seed(20261207)
    return torch.randint(0, vocab_size, (n,), generator=gen).tolist()


def probe_gaps(model, probe) -> torch.Tensor:
    """|the engine's log-prob of each probe token after the ones before it (`probe(ids)`) minus
    `model`'s own|, at temperature 1. (L-1,) float64"""
    from hindsight.maths.logprobs import token_logprobs

    ids = probe_ids(model.config.get_text_config().vocab_size)
    engine = torch.tensor(probe(ids), dtype=torch.float64)                                   # (L-1,)
    batch = torch.tensor([ids])                                                               # (1, L)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        own, _ = token_logprobs(model, batch, torch.ones_like(batch), len(ids) - 1)          # (1, L-1)
    model.train(was_training)
    return (own[0].double().cpu() - engine).abs()
