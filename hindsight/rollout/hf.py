"""Batched group sampling: one prefill per prompt, one decode loop for every group of the batch.

`generate` (transformers) repeats each prompt G times and samples the whole batch from one
global RNG, so a group's samples depend on what else is in the batch. Here:

- each prompt is prefilled once and its KV cache copied to its G samples, which saves the
  other G - 1 prefills;
- each group draws its randomness from its own generator, seeded by (run seed, step, group),
  as Gumbel noise fixed before decoding. argmax(logits / T + Gumbel) is an exact sample of
  softmax(logits / T), so a group's tokens are a function of its seed and the weights, not of
  the batch it shares (up to float rounding, which flips a token only at a near-tie);
- decoding stops when every row has ended, not at `max_new_tokens`.

The behaviour log-probs are then computed by one forward of the learner's own function
(`group_token_logprobs`), not read off the decoding logits: those are one-token matmuls whose
float rounding changes with the thread count (a Ray actor's 1 thread against the stage's 2
gave 5e-7 apart), and stored rows must be the same bits wherever they were sampled.
`logprobs="decode"` (`rollout.logprobs: decode`) reads them off the decoding logits instead:
one forward fewer, equal to the recompute to ~1e-6, the same bits only at the same thread
count (one sampler process, as async RL has).
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
from transformers.cache_utils import DynamicLayer

from hindsight.data.chat import prompt_text
from hindsight.maths.experience import Experience, pad_left
from hindsight.maths.logprobs import budgeted_logprobs, cache_kwargs, model_device, output_cache, position_ids
from hindsight.rollout.decoding import completion_mask, end_token_ids
from hindsight.rollout.prepacked import prepacked_linears


def gumbel_noise(generators: list[torch.Generator], rows: int, vocab: int) -> torch.Tensor:
    """(len(generators) * rows, vocab) standard Gumbel noise, `rows` rows from each group's own
    generator. Drawn step by step (a whole-completion draw would be T x V per row), into one
    buffer and transformed in place: the same bits as `torch.rand` per group then two out-of-place
    logs, without four (B, V) temporaries a step (bench/decode_bound.py: the loop's own time)."""
    u = torch.empty((len(generators) * rows, vocab), device=generators[0].device if generators else None)  # (B, V)
    for i, g in enumerate(generators):
        u[i * rows:(i + 1) * rows].uniform_(generator=g)                             # (rows, V) group i's own
    return u.clamp_(1e-10, 1.0 - 1e-7).log_().neg_().log_().neg_()                  # (B, V) -log(-log u)


def nucleus_logits(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """(B, V) logits with the tokens outside the top-p nucleus set to -inf."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)                    # (B, V)
    probs = sorted_logits.softmax(-1)                                               # (B, V)
    outside = probs.cumsum(-1) - probs > top_p                                      # (B, V) mass before it > p
    outside_orig = torch.zeros_like(outside).scatter(-1, order, outside)            # (B, V)
    return logits.masked_fill(outside_orig, float("-inf"))


def pick_tokens(logits: torch.Tensor, noise: torch.Tensor | None, temperature: float, top_p: float) -> torch.Tensor:
    """(B,) sampled token ids: Gumbel-max over the tempered, nucleus-filtered logits (B, V)."""
    if temperature <= 0:  # greedy
        return logits.argmax(-1)
    return (nucleus_logits(logits.float() / temperature, top_p) + noise).argmax(-1)


@torch.no_grad()
def sample_groups(model, tok, prompts: list[str], seeds: list[int], group_size: int, max_new_tokens: int,
                  temperature: float = 1.0, top_p: float = 1.0, logprobs: str = "forward",
                  budget: int | None = None, prepack: bool = True) -> Experience:
    """Sample `group_size` completions of each prompt; group i uses seeds[i]; temperature 0 is
    greedy (evaluation). Rows come out in groups, prompts left-padded and completions
    right-padded, as `generate` returns them. A row ends at any of the model's end tokens
    (`decoding.end_token_ids`). The behaviour log-probs' forward runs `budget` padded tokens at a
    time (rl.forward.micro_batch_tokens). `prepack`: see `decode`."""
    dev = model_device(model)
    seqs = [tok(prompt_text(tok, p), add_special_tokens=False)["input_ids"] for p in prompts]
    ids, mask = pad_left(seqs, tok.pad_token_id)                                   # (P, L)
    gens = [torch.Generator(device=dev).manual_seed(s) for s in seeds]
    was_training = model.training
    model.eval()
    completion_ids, cmask, decoded = decode(model, ids, mask, gens, group_size, max_new_tokens, temperature, top_p,
                                            end_token_ids(tok, model), tok.pad_token_id, logprobs == "decode",
                                            prepack=prepack)
    prompt_ids, prompt_mask = ids.repeat_interleave(group_size, 0), mask.repeat_interleave(group_size, 0)
    if logprobs == "decode":
        logp = decoded                                                              # (B, T')
    else:
        scale = temperature if temperature > 0 else 1.0
        sampled = Experience(prompt_ids, prompt_mask, completion_ids, cmask, torch.zeros(cmask.shape), group_size)
        logp = budgeted_logprobs(model, sampled, scale, budget)                     # (B, T')
    model.train(was_training)
    return Experience(prompt_ids, prompt_mask, completion_ids, cmask, logp.cpu() * cmask, group_size)


class _Preallocated(DynamicLayer):
    """A KV-cache layer's keys and values in buffers sized for the whole decode: a new position
    is written in place and the layer hands back views of the filled part, where
    `DynamicLayer.update` concatenates and so copies the layer's whole cache every step (a sixth
    of a SmolLM2 decode's time on this CPU, `bench/decode_bound.py`)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        self.is_initialized = True
        b, h, n, _ = keys.shape
        self.device = keys.device
        self._k = keys.new_empty((b, h, capacity, keys.shape[-1]))                 # (B, H, N_max, D)
        self._v = values.new_empty((b, h, capacity, values.shape[-1]))             # (B, H, N_max, D)
        self._k[:, :, :n], self._v[:, :, :n] = keys, values
        self.keys, self.values, self.n = self._k[:, :, :n], self._v[:, :, :n], n   # the filled part, as views

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        m = key_states.shape[-2]
        self._k[:, :, self.n:self.n + m], self._v[:, :, self.n:self.n + m] = key_states, value_states
        self.n += m
        self.keys, self.values = self._k[:, :, :self.n], self._v[:, :, :self.n]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.n

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("a preallocated decode cache is not cropped")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise RuntimeError("a preallocated decode cache is made after the prompts are repeated")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise RuntimeError("a preallocated decode cache keeps every row")


def preallocate(cache, new_positions: int) -> None:
    """Give each of a cache's full-attention layers room for `new_positions` more positions (a
    sliding-window or other layer is left as it is)."""
    for i, layer in enumerate(getattr(cache, "layers", [])):
        if type(layer) is DynamicLayer and layer.is_initialized and layer.get_seq_length() > 0:
            cache.layers[i] = _Preallocated(layer.keys, layer.values, layer.get_seq_length() + new_positions)


@torch.no_grad()
def decode(model, ids: torch.Tensor, mask: torch.Tensor, gens: list[torch.Generator], group_size: int,
           max_new_tokens: int, temperature: float, top_p: float, stop_ids, pad_id: int, with_logprobs: bool = False,
           preallocated: bool = True, prepack: bool = True):
    """Decode `group_size` rows from each left-padded context of `ids` (P, L), context i's rows
    drawing from gens[i] (so a row's tokens never depend on its batch-mates), until every row
    has ended at one of `stop_ids` or `max_new_tokens`. Returns (completion ids (B, T') padded
    with `pad_id` after a row's end, completion mask (B, T'), the decoding log-probs (B, T') or
    None), B = P x group_size. A multi-turn rollout calls it once a turn with its histories.
    `preallocated`: the KV cache grows in place (`_Preallocated`), not by concatenation.
    `prepack`: on a CPU the large float32 linears run prepacked for oneDNN (`rollout.prepacked`)."""
    with prepacked_linears(model) if prepack else nullcontext():
        return _decode(model, ids, mask, gens, group_size, max_new_tokens, temperature, top_p, stop_ids, pad_id,
                       with_logprobs, preallocated)


def _decode(model, ids, mask, gens, group_size, max_new_tokens, temperature, top_p, stop_ids, pad_id,
            with_logprobs, preallocated):
    dev = model_device(model)
    stops = torch.tensor(list(stop_ids), device=dev)                               # (E,)
    out = model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=position_ids(mask).to(dev),
                use_cache=True)
    cache = output_cache(out)
    cache.batch_repeat_interleave(group_size)                                       # (P*G, ...) per layer
    if preallocated:
        preallocate(cache, max_new_tokens)
    logits = out.logits[:, -1].repeat_interleave(group_size, 0)                     # (B, V), B = P*G
    attn = mask.repeat_interleave(group_size, 0).to(dev)                            # (B, L)
    pos = (attn.sum(-1, keepdim=True) - 1)                                          # (B, 1) last prompt position
    done = torch.zeros(len(attn), dtype=torch.bool, device=dev)                     # (B,)
    tokens, decoded = [], []
    scale = temperature if temperature > 0 else 1.0
    for t in range(max_new_tokens):
        noise = gumbel_noise(gens, group_size, logits.size(-1)) if temperature > 0 else None  # (B, V)
        nxt = pick_tokens(logits, noise, temperature, top_p)                        # (B,)
        nxt = nxt.masked_fill(done, pad_id)
        tokens.append(nxt)
        if with_logprobs:
            decoded.append(torch.log_softmax(logits.float() / scale, -1).gather(-1, nxt[:, None]).squeeze(-1))  # (B,)
        done |= torch.isin(nxt, stops)
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)               # (B, L+t+1)
        pos = pos + 1
        out = model(input_ids=nxt[:, None], attention_mask=attn, position_ids=pos, **cache_kwargs(model, cache))
        logits = out.logits[:, -1]                                                  # (B, V)
    completion_ids = torch.stack(tokens, dim=1).cpu()                               # (B, T')
    cmask = completion_mask(completion_ids, stops.tolist())                         # (B, T')
    completion_ids = completion_ids.masked_fill(cmask == 0, pad_id)
    return completion_ids, cmask, torch.stack(decoded, dim=1) if with_logprobs else None
