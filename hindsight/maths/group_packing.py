"""A group's completions packed after its one prompt: the shared-prompt forward without padding.

The shared-prompt forward (`logprobs.group_token_logprobs`) runs each group's prompt once and
then every row's completion, right-padded to the micro-batch's widest. With sampled lengths
that waste is most of the work: on the SmolLM2 recipe (mean 46 of 128 tokens, a quarter cut at
128) the completions' forward ran 2.8 times the tokens it needed.

Here a group's G completions run end to end in one sequence after the group's cached prompt,
and a 4-D attention mask keeps them apart: a completion token sees the prompt's real tokens and
the tokens of its own completion before it, nothing else, at the positions the padded forward
gave it. That is the padded forward's maths on real tokens only (to float round-off), with its
gradient flowing through the one prompt cache, which no longer needs copying G times.

The mask is dense, so its attention costs S x (P + S) per group (S the group's completion
tokens) where the padded forward's costs G x T x (P + T): `worth_it` weighs both against the
linear layers' per-token cost and packs only where it wins (short, uneven completions; not a
long group of long ones).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# transformers' attention functions that take a ready 4-D mask, and the form each wants it in
# (sdpa: True where a query may attend; eager: 0 there, the dtype's minimum elsewhere, added)
MASK_FORMS = ("sdpa", "eager")


@dataclass(frozen=True)
class GroupPacked:
    input_ids: torch.Tensor     # (B/G, S) each group's completions but their last token, end to end, then pad
    position_ids: torch.Tensor  # (B/G, S) the positions the padded forward gave each token
    allowed: torch.Tensor       # (B/G, 1, S, P + S) bool: which prompt and packed keys each query sees
    kept: torch.Tensor          # (M,) the flat (B/G * S) index of each input predicting a completion token
    rows: torch.Tensor          # (M,) that token's row in the batch
    cols: torch.Tensor          # (M,) its completion column (1.. ; column 0 comes from the prompt's last)

    def to(self, device) -> "GroupPacked":
        return GroupPacked(*(t.to(device) for t in (self.input_ids, self.position_ids, self.allowed, self.kept,
                                                    self.rows, self.cols)))


def completion_lengths(attention_mask: torch.Tensor, n_completion: int) -> torch.Tensor | None:
    """(B,) real tokens of each completion, or None where a completion's mask is not a run of
    ones then zeros (the padded layout this packing reproduces)."""
    cm = attention_mask[:, attention_mask.size(1) - n_completion:]                   # (B, T)
    if n_completion > 1 and bool((cm[:, 1:] > cm[:, :-1]).any()):
        return None
    return cm.sum(-1)                                                                 # (B,)


def layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int, group_size: int,
           lengths: torch.Tensor, pad_id: int = 0) -> GroupPacked:
    """input_ids, attention_mask: (B, P+T), prompts left-padded and alike within each group of
    `group_size` rows, completions right-padded with `lengths` (B,) real tokens."""
    b, width = input_ids.shape
    p, groups = width - n_completion, b // group_size
    n_in = (lengths - 1).clamp(min=0).view(groups, group_size)                        # (B/G, G) inputs per row
    s = max(int(n_in.sum(-1).max()), 1)
    prompt_real = attention_mask[::group_size, :p].sum(-1)                            # (B/G,)
    ids = torch.full((groups, s), pad_id, dtype=input_ids.dtype)                      # (B/G, S)
    pos = torch.zeros((groups, s), dtype=torch.long)                                  # (B/G, S)
    owner = torch.full((groups, s), -1, dtype=torch.long)                             # (B/G, S) which row, -1 pad
    kept, rows, cols = [], [], []
    for g in range(groups):
        off = 0
        for j in range(group_size):
            r, n = g * group_size + j, int(n_in[g, j])
            ids[g, off:off + n] = input_ids[r, p:p + n]
            pos[g, off:off + n] = prompt_real[g] + torch.arange(n)
            owner[g, off:off + n] = j
            kept.append(g * s + off + torch.arange(n))
            rows.append(torch.full((n,), r))
            cols.append(1 + torch.arange(n))
            off += n
    idx = torch.arange(s)
    same = (owner[:, :, None] == owner[:, None, :]) & (owner[:, :, None] >= 0)       # (B/G, S, S)
    causal = idx[None, :, None] >= idx[None, None, :]                                 # (1, S, S)
    own = same & causal | torch.eye(s, dtype=torch.bool)[None]  # a pad query sees itself: no empty softmax row
    sees_prompt = (owner >= 0)[:, :, None] & attention_mask[::group_size, None, :p].bool()  # (B/G, S, P)
    allowed = torch.cat([sees_prompt, own], dim=-1)[:, None]                          # (B/G, 1, S, P + S)
    return GroupPacked(ids, pos, allowed, torch.cat(kept), torch.cat(rows), torch.cat(cols))  # a piece per row


def attention_form(config) -> str | None:
    """How a model of this config takes a ready 4-D mask (one of MASK_FORMS), or None: another
    attention implementation (flash attention takes none), or a model with sliding-window or other
    non-global layers, which transformers would give the same mask unchanged."""
    impl = getattr(config, "_attn_implementation", None)
    if impl not in MASK_FORMS:
        return None
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) or getattr(config, "sliding_window", None) and \
            getattr(config, "use_sliding_window", True):
        return None
    return impl


def as_mask(allowed: torch.Tensor, form: str, dtype: torch.dtype) -> torch.Tensor:
    """The bool `allowed` in the form `form`'s attention function reads."""
    if form == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


def worth_it(lengths: torch.Tensor, prompt_width: int, n_completion: int, group_size: int, hidden: int,
             params_per_layer: float) -> bool:
    """Whether the packed completions cost fewer FLOPs than the padded ones: per query token,
    the linear layers' 2 x params_per_layer, plus attention's 4 x hidden per key it scores (a
    dense mask scores every key of its sequence). Layers and the output layer, alike in both,
    cancel out of the comparison but for the head's B x T against M positions, left out: it
    favours packing, so leaving it out only errs towards the padded path."""
    b = lengths.numel()
    groups, t = b // group_size, max(n_completion - 1, 0)
    s = int((lengths - 1).clamp(min=0).view(groups, group_size).sum(-1).max())
    linear, attend = 2.0 * params_per_layer, 4.0 * hidden
    padded = b * t * (linear + attend * (prompt_width + t))
    packed = groups * s * (linear + attend * (prompt_width + s))
    return packed < padded
