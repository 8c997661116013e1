"""Per-token log-probabilities and entropies of completions under a causal LM."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from functools import lru_cache

import torch
from torch.utils.checkpoint import checkpoint

from hindsight.maths.experience import Experience, lengths, micro_batches, trimmed
from hindsight.maths.group_packing import as_mask, attention_form, completion_lengths, layout, worth_it
from hindsight.maths.packing import pack, unpack, worth_packing


# set on a model by a learner strategy whose every forward is a collective over the group
# (FSDP2 gathers each layer's weights): the shared-prompt path, which runs a different number of
# forwards on different rows, is then not taken
COLLECTIVE_FORWARD = "_hindsight_collective_forward"
# completion tokens whose logits are held at once (`hidden_out`): 1,024 x a 49,152 vocabulary is
# 0.2 GB in float32, where a 2,048-token micro-batch's whole logits were 0.4 GB a copy; 0: whole
LOGIT_CHUNK = 1024
_CHUNK_EXACT = "_hindsight_chunk_exact"  # a model's `_chunk_exact` verdict, found once
_LAYER_COST = "_hindsight_layer_cost"    # a model's `_layer_cost`, counted once
# the shared-prompt forward runs a group's completions packed after its prompt where that costs
# less (`hindsight.maths.group_packing`); False: always padded rows (for comparisons)
GROUP_PACKING = True


def compute_autocast(model):
    """bf16 compute on float32 master weights: autocast when the builder gave the model a lower
    compute dtype (`model.dtype: bfloat16`), else nothing. Frozen models loaded in bf16 need none."""
    dtype = getattr(model, "compute_dtype", None) or getattr(getattr(model, "module", None), "compute_dtype", None)
    if dtype in (None, torch.float32, torch.float64):
        return nullcontext()
    return torch.autocast(model_device(model).type, dtype=dtype)


def model_device(model) -> torch.device:
    """Where a model's weights live; also for a DDP wrapper, which has no `.device`."""
    return next(model.parameters()).device


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions that skip left padding, matching what `generate` used."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                   temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True):
    """Log-prob of each completion token given everything before it.

    input_ids, attention_mask: (B, P+T). Returns logp (B, T) and, if asked, entropy (B, T).
    Logits are divided by the sampling temperature, as TRL does, so the ratio against the
    behaviour log-probs is exactly 1 before the first update.
    """
    dev = model_device(model)
    input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
    with compute_autocast(model), hidden_out(model) as head:
        out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask),
                    use_cache=False, **keep_logits(model, n_completion + 1))
    return _stats(model, head, out.logits[:, -n_completion - 1:-1, :], input_ids[:, -n_completion:], temperature,
                  with_entropy, entropy_grad)


def keep_logits(model, keep: int | torch.Tensor) -> dict:
    """Only the logits that are read (transformers' `logits_to_keep`, as TRL asks for): the last
    `keep` positions, or a boolean (N, W) mask of positions (a packed forward: (M, V) logits). The
    prompt's are never read, and (B, L, V) is the largest tensor of the forward. transformers
    before 5.20 (what vLLM's CPU build pins) takes no mask: there a packed forward returns its
    whole (N, W, V) logits and `kept_rows` picks the kept ones."""
    mask = isinstance(keep, torch.Tensor) and keep.dim() == 2
    takes = "logits_to_keep" in _forward_parameters(type(_innermost(model))) and (not mask or _slices_masks())
    return {"logits_to_keep": keep} if takes else {}


@lru_cache(maxsize=None)
def _slices_masks() -> bool:  # transformers 5.20+ slices logits by a boolean mask
    import transformers.modeling_utils as modeling

    return hasattr(modeling, "slice_logits_to_keep")


@lru_cache(maxsize=None)
def _forward_parameters(model_type: type) -> frozenset:
    import inspect

    return frozenset(inspect.signature(model_type.forward).parameters)


def _from_logits(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
                 entropy_grad: bool):
    """logits (B, T, V), targets (B, T) -> logp (B, T) and entropy (B, T) or None. Without
    `entropy_grad` the entropy is a statistic: computed outside the graph, so it keeps no
    (B, T, V) tensor alive for the backward."""
    logits = at_least_fp32(logits)
    if temperature != 1.0:  # a (B, T, V) copy only when it changes something
        logits = logits / temperature
    logsm = torch.log_softmax(logits, dim=-1)                                                # (B, T, V)
    logp = logsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)                               # (B, T)
    if not with_entropy:
        return logp, None
    if not entropy_grad:
        with torch.no_grad():
            return logp, -(logsm.exp() * logsm).sum(-1)                                      # (B, T)
    return logp, -(logsm.exp() * logsm).sum(-1)                                              # (B, T)


def _stats(model, head, x: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
           entropy_grad: bool):
    """`_from_logits` of x, the logits (B, T, V), or with `head` the final hidden states (B, T, H)."""
    if head is None:
        return _from_logits(x, targets, temperature, with_entropy, entropy_grad)
    return _from_hidden(model, head, x, targets, temperature, with_entropy, entropy_grad)


def _from_hidden(model, head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
                 entropy_grad: bool):
    """hidden (B, T, H), targets (B, T) -> what `_from_logits(head(hidden), ...)` gives, LOGIT_CHUNK
    positions at a time. Under autograd each chunk is checkpointed: its logits are recomputed in
    the backward, so at most one chunk's (C, V) logits and their softmax are alive at once."""
    b, t, _ = hidden.shape
    flat, goal = hidden.reshape(b * t, -1), targets.reshape(b * t)                            # (N, H), (N,)

    def chunk(h: torch.Tensor, y: torch.Tensor):                                             # (C, H), (C,)
        with compute_autocast(model):
            logits = head(h)                                                                  # (C, V)
        logp, entropy = _from_logits(logits.unsqueeze(0), y.unsqueeze(0), temperature, with_entropy, entropy_grad)
        return logp[0], (logp[0] if entropy is None else entropy[0])                          # (C,), (C,)

    grad = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    parts = []
    for s in range(0, b * t, LOGIT_CHUNK):
        h, y = flat[s:s + LOGIT_CHUNK], goal[s:s + LOGIT_CHUNK]
        parts.append(checkpoint(chunk, h, y, use_reentrant=False) if grad else chunk(h, y))
    logp = torch.cat([q[0] for q in parts]).view(b, t)                                        # (B, T)
    entropy = torch.cat([q[1] for q in parts]).view(b, t) if with_entropy else None           # (B, T)
    return logp, entropy


@contextmanager
def hidden_out(model):
    """While on, the model's forward returns its final hidden states where it returned logits
    (its output layer swapped for the identity; `logits_to_keep` still slices before it), and
    yields the output layer, so `_from_hidden` computes the log-probs a chunk of positions at a
    time and the (N, V) logits, the largest tensors of a step, are never held whole.

    Yields None and changes nothing where that would not be exact or not save anything: chunking
    off (LOGIT_CHUNK 0); a forward that is a collective (FSDP2 gathers the output layer inside
    it) or a DDP wrapper; a model whose forward changes its logits after the output layer
    (soft-capping, scaling), which `_chunk_exact` finds once per model. Not thread-safe: one
    forward of a model at a time, as the learner and scorer run them."""
    inner = _innermost(model)
    head = inner.get_output_embeddings() if LOGIT_CHUNK and hasattr(inner, "get_output_embeddings") else None
    name = next((n for n, m in inner.named_children() if m is head), None) if head is not None else None
    if name is None or getattr(model, COLLECTIVE_FORWARD, False) or \
            isinstance(model, torch.nn.parallel.DistributedDataParallel) or not _chunk_exact(model, inner, name, head):
        yield None
        return
    with _swapped(inner, name, torch.nn.Identity()):
        yield head


@contextmanager
def _swapped(module, name: str, replacement):
    original = getattr(module, name)
    setattr(module, name, replacement)
    try:
        yield
    finally:
        setattr(module, name, original)


def _chunk_exact(model, inner, name: str, head) -> bool:
    """Whether the output layer applied to the hidden states gives the model's own logits (once
    per model, on 4 tokens): false for a model that soft-caps or scales them after the layer."""
    known = getattr(inner, _CHUNK_EXACT, None)
    if known is None:
        ids = torch.arange(1, 5, device=model_device(model)).unsqueeze(0) % int(inner.config.vocab_size)   # (1, 4)
        with torch.no_grad():
            full = model(input_ids=ids, use_cache=False).logits.float()                       # (1, 4, V)
            with _swapped(inner, name, torch.nn.Identity()):
                hidden = model(input_ids=ids, use_cache=False).logits                         # (1, 4, H)
            known = hidden.shape[-1] != full.shape[-1] and torch.allclose(head(hidden).float(), full, rtol=1e-4,
                                                                          atol=1e-5)
        object.__setattr__(inner, _CHUNK_EXACT, bool(known))
    return known


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """bf16 / fp16 logits up to fp32 for the softmax; fp32 and fp64 as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def cache_kwargs(model, cache) -> dict:
    """The keyword a model's forward takes its KV cache by: `cache` in recent transformers 5.x,
    `past_key_values` before (still accepted, with a deprecation warning per process)."""
    return {_cache_keyword(type(_innermost(model))): cache, "use_cache": True}


def _innermost(model):
    """The transformers model under wrappers that pass keywords through (a PEFT adapter model,
    the LoRA reference view): its forward's signature decides the keyword."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _cache_keyword(model_type: type) -> str:
    return "cache" if "cache" in _forward_parameters(model_type) else "past_key_values"


def output_cache(out):
    return getattr(out, "cache", None) or out.past_key_values


def shares_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int, group_size: int) -> bool:
    """Whether the rows come in groups of `group_size` that hold one prompt each (then the
    prompt can be run once per group)."""
    b, width = input_ids.shape
    if group_size <= 1 or b % group_size or width - n_completion < 1:
        return False
    p = width - n_completion
    ids, mask = input_ids[:, :p].view(b // group_size, group_size, p), attention_mask[:, :p].view(b // group_size, group_size, p)
    return bool((ids == ids[:, :1]).all() and (mask == mask[:, :1]).all())


def can_share_prompts(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                      group_size: int) -> bool:
    # DDP reduces gradients once per forward, and a forward that is a collective must run as
    # often on every rank: two forwards on one rank and one on another would deadlock
    return not (isinstance(model, torch.nn.parallel.DistributedDataParallel) or getattr(model, COLLECTIVE_FORWARD, False)
                or checkpointing(model)) and shares_prompts(input_ids, attention_mask, n_completion, group_size)


def micro_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int, group_size: int,
                   temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True,
                   packing: str = "off"):
    """A micro-batch's (B, T) log-probs (and entropies) by the cheapest exact path: packed
    (`rl.learner.packing`: `on`, or `auto` where the gate finds it saves tokens), else the
    shared-prompt forward where it applies, else one padded forward."""
    if packs(model, attention_mask, n_completion, group_size, packing, input_ids):
        return packed_token_logprobs(model, input_ids, attention_mask, n_completion, temperature, with_entropy,
                                     entropy_grad)
    return group_token_logprobs(model, input_ids, attention_mask, n_completion, group_size, temperature, with_entropy,
                                entropy_grad)


def packs(model, attention_mask: torch.Tensor, n_completion: int, group_size: int, packing: str,
          input_ids: torch.Tensor) -> bool:
    """Whether a micro-batch's forward runs packed: `on`, or `auto` and the gate's choice against
    the path it would take otherwise (the shared-prompt forward where it applies)."""
    if packing != "auto":
        return packing == "on"
    shared = can_share_prompts(model, input_ids, attention_mask, n_completion, group_size)
    if shared and packs_groups(model, attention_mask, n_completion, group_size):
        return False  # the shared prompt once and the completions packed: fewer tokens than rows packed
    return worth_packing(attention_mask, n_completion, group_size if shared else None)


def packed_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                          temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = True):
    """`token_logprobs` on the rows packed end to end (`hindsight.maths.packing`): (B, T) logp and
    entropy, 0 at masked positions."""
    dev = model_device(model)
    packed = pack(input_ids.cpu(), attention_mask.cpu(), n_completion).to(dev)
    with compute_autocast(model), hidden_out(model) as head:
        out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                    **keep_logits(model, packed.keep))
    logits = kept_rows(out.logits, packed.keep, model)                               # (M, V), or (M, H) hidden
    logp, entropy = _stats(model, head, logits.unsqueeze(0), packed.targets.unsqueeze(0), temperature,
                           with_entropy, entropy_grad)                                        # (1, M)
    shape = (input_ids.size(0), n_completion)
    return unpack(logp[0], packed, shape), None if entropy is None else unpack(entropy[0], packed, shape)


def kept_rows(logits: torch.Tensor, keep: torch.Tensor, model) -> torch.Tensor:
    """(M, V) from a model that honoured the boolean mask, or from its full (N, W, V) logits."""
    if logits.dim() == 2 and logits.size(0) == int(keep.sum()):
        return logits
    if logits.dim() == 3 and logits.shape[:2] == keep.shape:
        return logits[keep]
    raise TypeError(f"{type(_innermost(model)).__name__}: packed forward returned logits of shape "
                    f"{tuple(logits.shape)} for a mask of {tuple(keep.shape)} (rl.learner.packing: off avoids it)")


def group_token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                         group_size: int, temperature: float = 1.0, with_entropy: bool = False,
                         entropy_grad: bool = True):
    """`token_logprobs`, with each group's shared prompt run once: its keys and values are
    copied to the group's G rows and only the completions run per row. The same maths as one
    forward over (prompt + completion) per row (gradients flow through the copied cache to the
    prompt), at about P/G + T tokens per row instead of P + T. Rows that do not share their
    prompts in groups take the plain path, and so does a model training under activation
    checkpointing: transformers turns the KV cache off there, and the copied cache is what
    this path runs on."""
    if not can_share_prompts(model, input_ids, attention_mask, n_completion, group_size):
        return token_logprobs(model, input_ids, attention_mask, n_completion, temperature, with_entropy, entropy_grad)
    dev = model_device(model)
    packed = _group_packed(model, input_ids, attention_mask, n_completion, group_size)
    input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
    p = input_ids.size(1) - n_completion
    prompt, pmask = input_ids[::group_size, :p], attention_mask[::group_size, :p]            # (B/G, P)
    with compute_autocast(model), hidden_out(model) as head:  # "logits" below: hidden states where head is set
        out = model(input_ids=prompt, attention_mask=pmask, position_ids=position_ids(pmask), use_cache=True,
                    **keep_logits(model, 1))
        cache = output_cache(out)
        if packed is not None:
            return _packed_completions(model, head, packed, out.logits[:, -1], cache, input_ids[:, p:], group_size,
                                       temperature, with_entropy, entropy_grad)
        cache.batch_repeat_interleave(group_size)                                             # (B, ...) per layer
        first = out.logits[:, -1:].repeat_interleave(group_size, 0)                           # (B, 1, V)
        logits = first                                                                        # (B, 1, V)
        if n_completion > 1:  # the completions but their last token, after the copied prompt cache
            pos = position_ids(attention_mask)                                                # (B, P+T)
            rest = model(input_ids=input_ids[:, p:-1], attention_mask=attention_mask[:, :-1],
                         position_ids=pos[:, p:-1], **cache_kwargs(model, cache)).logits      # (B, T-1, V)
            logits = torch.cat([first, rest], dim=1)                                          # (B, T, V)
    return _stats(model, head, logits, input_ids[:, p:], temperature, with_entropy, entropy_grad)


def _group_packed(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                  group_size: int):
    """(the mask form, `group_packing.layout`) where each group's completions run packed after
    its prompt (`hindsight.maths.group_packing`); else None."""
    form = packs_groups(model, attention_mask, n_completion, group_size)
    if form is None:
        return None
    lengths = completion_lengths(attention_mask, n_completion).cpu()
    return form, layout(input_ids.cpu(), attention_mask.cpu(), n_completion, group_size, lengths)


def packs_groups(model, attention_mask: torch.Tensor, n_completion: int, group_size: int) -> str | None:
    """The 4-D mask form where the shared-prompt forward packs each group's completions (the
    model takes such a mask, the completions are right-padded, and packed costs less), else None."""
    form = attention_form(_innermost(model).config) if GROUP_PACKING else None
    lengths = completion_lengths(attention_mask, n_completion) if form else None
    if lengths is None or not worth_it(lengths.cpu(), attention_mask.size(1) - n_completion, n_completion,
                                       group_size, *_layer_cost(model)):
        return None
    return form


def _packed_completions(model, head, packed, last, cache, completions: torch.Tensor, group_size: int,
                        temperature: float, with_entropy: bool, entropy_grad: bool):
    """logp and entropy (B, T) from the prompts' last outputs `last` (B/G, X) and their `cache`:
    each group's completions run end to end after its cache, under the layout's 4-D mask."""
    form, gp = packed
    gp = gp.to(last.device)
    b, t = completions.shape
    x, targets = last.repeat_interleave(group_size, 0), completions[:, 0]                    # (B, X), (B,)
    if gp.kept.numel():
        mask = as_mask(gp.allowed, form, last.dtype)                                          # (B/G, 1, S, P+S)
        rest = model(input_ids=gp.input_ids, attention_mask=mask, position_ids=gp.position_ids,
                     **cache_kwargs(model, cache)).logits                                     # (B/G, S, X)
        x = torch.cat([x, rest.reshape(-1, rest.size(-1))[gp.kept]])                          # (B + M, X)
        targets = torch.cat([targets, completions[gp.rows, gp.cols]])                         # (B + M,)
    logp, entropy = _stats(model, head, x.unsqueeze(0), targets.unsqueeze(0), temperature, with_entropy,
                           entropy_grad)                                                      # (1, B + M)
    rows = torch.cat([torch.arange(b, device=x.device), gp.rows])                             # (B + M,)
    cols = torch.cat([torch.zeros(b, dtype=torch.long, device=x.device), gp.cols])            # (B + M,)

    def spread(v: torch.Tensor) -> torch.Tensor:                                              # (1, B + M) -> (B, T)
        return torch.zeros((b, t), dtype=v.dtype, device=v.device).index_put((rows, cols), v[0])

    return spread(logp), None if entropy is None else spread(entropy)


def _layer_cost(model) -> tuple[int, float]:
    """(hidden size, parameters a decoder layer) for `group_packing.worth_it`, counted once."""
    inner = _innermost(model)
    known = getattr(inner, _LAYER_COST, None)
    if known is None:
        config = inner.config
        heads = {id(p) for m in (inner.get_input_embeddings(), inner.get_output_embeddings()) if m is not None
                 for p in m.parameters()}
        body = sum(p.numel() for p in inner.parameters() if id(p) not in heads)
        known = (int(config.hidden_size), body / max(int(config.num_hidden_layers), 1))
        object.__setattr__(inner, _LAYER_COST, known)
    return known


def checkpointing(model) -> bool:
    """Whether the model recomputes activations in its backward (and so runs without a KV cache)."""
    inner = _innermost(model)
    on = getattr(inner, "is_activation_checkpointing", None)  # transformers >= 5.20; before, the old name
    return bool(model.training and (on if on is not None else getattr(inner, "is_gradient_checkpointing", False)))


@torch.no_grad()
def budgeted_logprobs(model, exp: Experience, temperature: float, budget: int | None,
                      packing: str = "off") -> torch.Tensor:
    """(B, T) `group_token_logprobs` of a batch without a graph, a micro-batch of at most
    `budget` padded tokens at a time (the behaviour and reference forwards of `rl.forward.micro_batch_tokens`)."""
    out = torch.zeros(exp.completion_mask.shape, dtype=torch.float32)                          # (B, T)
    for rows in micro_batches(*lengths(exp), exp.group_size, budget):
        part = trimmed(exp, rows)
        logp, _ = micro_logprobs(model, part.input_ids, part.attention_mask, part.completion_ids.size(1),
                                 part.group_size, temperature, packing=packing)               # (b, t)
        out[rows, : logp.size(1)] = logp.float().cpu()
    return out
