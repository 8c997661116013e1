"""What vLLM's worker learns from hindsight (`worker_extension_cls`): methods that load named
weights into the engine's model, so the RL stage can push weights by the methods' names through
`LLM.collective_rpc` into an engine in another process. They run inside vLLM's worker (`self` is
that worker) and import nothing of vLLM itself.

Weights travel as safetensors bytes: vLLM carries `collective_rpc`'s arguments to its engine core
with msgpack and decodes them untyped there, so a tensor argument arrives as a
[dtype, shape, buffer index] list whose buffer is gone; bytes arrive as bytes (and no pickle is
involved on either side).

A full copy arrives a bucket at a time, each with its checksum, into the worker's copy under the
Hugging Face names (CPU, the serving dtype); once every bucket is in (`hindsight_hold_version`)
the engine loads the version in one go. A delta (`transport.delta`) then needs only the elements
that changed: the worker checks its checksum and base version, writes the changes into its copy
and loads the tensors they touched, with the rest of each engine layer they belong to.

The load is vLLM's own in-place reload (`model_runner.reload_weights`): after loading, vLLM
processes a layer's weights into its kernels' form (on a CPU, oneDNN's packed linears), and the
processed parameters no longer take Hugging Face tensors; the reload restores each layer to its
checkpoint form, loads it and processes it again once all of its weights are in. A layer must get
all of its tensors in one reload, hence one reload per version and whole layers for a delta.
A layer whose weight is tied to another's (an `lm_head` tied to the embedding) loads nothing of
its own, so the reload keeps what it had processed: on a CPU, a oneDNN handle made from the old
embedding, which went on scoring tokens with the first version's head until the weight check
caught it. Such layers are processed again after every reload (`_hindsight_refresh_tied`).

After a version is in, `hindsight_fingerprints` reads the engine's own parameters (vLLM's
layout, the device they live on) and `hindsight_layout` says which Hugging Face tensors each one
stacks, so the sender can check the engine against the learner exactly (`transport.fingerprint`).
"""
from __future__ import annotations


class _Held:
    """The worker's copy as `apply_delta` reads a model: by its state dict."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def state_dict(self) -> dict:
        return self.tensors


class WeightReceiver:
    def hindsight_dtype(self) -> str:
        """The dtype the engine's model holds its weights in ("bfloat16")."""
        return str(next(self.model_runner.model.parameters()).dtype).removeprefix("torch.")

    def hindsight_load_weights(self, data: bytes, sha256: str | None = None) -> int:
        """data: one bucket, safetensors bytes of Hugging Face name -> tensor; returns how many
        tensors were loaded, -1 for a bucket that fails its checksum or cannot be read (nothing of
        it is loaded)."""
        from hindsight.transport.payload import checksum

        weights = _tensors(data)
        if weights is None or (sha256 is not None and checksum(weights) != sha256):
            return -1
        held = self.__dict__.setdefault("_hindsight_held", {})
        held.update(weights)
        self._hindsight_version = None  # a full copy in progress: no delta applies until it is sealed
        return len(weights)

    def hindsight_hold_version(self, version: int) -> int:
        """Every bucket of `version`'s full copy is in: the engine loads it, and deltas from it may follow."""
        self._hindsight_reload(self._hindsight_held)
        self._hindsight_version = version
        return version

    def hindsight_apply_delta(self, version: int, base: int, sha256: str, data: bytes) -> str:
        """A delta from `base` to `version`; returns "" once applied, else why it was refused
        (then nothing of it is loaded and the sender sends the full copy)."""
        from hindsight.transport.delta import MalformedDelta, apply_delta
        from hindsight.transport.payload import CorruptWeights, WeightVersion, verified

        holds = getattr(self, "_hindsight_version", None)
        tensors = _tensors(data)
        if tensors is None:
            return f"weights version {version}: an unreadable delta"
        if holds != base:
            return f"a delta from version {base}, but this engine holds version {holds}: it needs a full copy"
        try:
            verified(WeightVersion(version, tensors, sha256, base=base))
        except CorruptWeights as exc:
            return str(exc)
        held = self._hindsight_held
        try:
            apply_delta(_Held(held), tensors)
        except MalformedDelta as exc:
            return str(exc)
        self._hindsight_reload(self._hindsight_whole_layers({key.rsplit("::", 1)[0] for key in tensors}))
        self._hindsight_version = version
        return ""

    def _hindsight_reload(self, names) -> None:
        """Load the held tensors `names` into the engine, in name order (a layer's tensors together)."""
        held = self._hindsight_held
        weights = [(name, held[name].to(self.device)) for name in sorted(names)]
        runner = self.model_runner
        if hasattr(runner, "reload_weights"):
            runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
            self._hindsight_refresh_tied()
        else:  # an older vLLM: its load_weights on the live model
            runner.model.load_weights(weights)

    def _hindsight_refresh_tied(self) -> None:
        """Process again every layer whose weight shares its storage with another layer's."""
        import torch

        by_storage: dict[int, list] = {}
        for module in self.model_runner.model.modules():
            weight = module._parameters.get("weight")
            if isinstance(weight, torch.Tensor) and weight.numel() and hasattr(module, "quant_method"):
                by_storage.setdefault(weight.untyped_storage().data_ptr(), []).append(module)
        for modules in by_storage.values():
            for module in modules if len(modules) > 1 else ():
                module.quant_method.process_weights_after_loading(module)

    def _hindsight_whole_layers(self, names: set) -> set:
        """`names` and every other tensor of the engine layers they load into (q with k and v)."""
        layers = self.__dict__.get("_hindsight_layers")
        if layers is None:  # engine layer -> the Hugging Face tensors it loads, by name (whatever form vLLM keeps)
            held, layers = self._hindsight_held, {}
            for engine_name, _ in self.model_runner.model.named_parameters():
                sources = {s for s in self._hindsight_sources(engine_name) if s in held}
                layers.setdefault(engine_name.rpartition(".")[0], set()).update(sources)
            self._hindsight_layers = layers
        return set(names).union(*(srcs for srcs in layers.values() if srcs & names))

    def hindsight_layout(self) -> list:
        """[(engine parameter name, [the Hugging Face names it stacks, in order], rows)] for every
        parameter of the engine's model that keeps its checkpoint form; rows is how many leading
        rows of the engine's tensor they fill (a vocabulary padded to a multiple of 64 has more).
        A parameter vLLM has processed into another form (a CPU linear handed to oneDNN, a bias
        widened to float32) is listed with no sources: the sender's probe checks it instead."""
        held = self.__dict__.get("_hindsight_held", {})
        out = []
        for name, param in self.model_runner.model.named_parameters():
            sources = self._hindsight_sources(name)
            readable = param.dim() > 0 and all(s in held and held[s].shape[1:] == param.shape[1:]
                                               and held[s].dtype == param.dtype for s in sources)
            rows = sum(held[s].shape[0] for s in sources) if readable else 0
            out.append((name, sources if readable and rows <= param.shape[0] else [], rows))
        return out

    def _hindsight_sources(self, name: str) -> list:
        """The Hugging Face names an engine parameter stacks, by the model's `packed_modules_mapping`
        (vLLM's fused qkv and gate_up), else its own name."""
        packed = dict(getattr(self.model_runner.model, "packed_modules_mapping", None) or {})
        module, _, leaf = name.rpartition(".")
        parent, _, last = module.rpartition(".")
        if last not in packed:
            return [name]
        return [f"{parent}.{part}.{leaf}" if parent else f"{part}.{leaf}" for part in packed[last]]

    def hindsight_fingerprints(self, layout: list) -> dict:
        """Engine parameter name -> `bit_fingerprint` of its first `rows` rows, as the engine holds
        them now (vLLM's layout and dtype, on its device)."""
        from hindsight.transport.fingerprint import bit_fingerprint

        params = dict(self.model_runner.model.named_parameters())
        return {name: bit_fingerprint(params[name][:rows]) for name, sources, rows in layout if sources}


def _tensors(data: bytes) -> dict | None:
    """safetensors bytes -> name -> CPU tensor, or None when they cannot be read (refused like a
    failed checksum)."""
    from hindsight.transport.payload import CorruptWeights, bytes_tensors

    try:
        return bytes_tensors(data)
    except CorruptWeights:
        return None
