"""Scalar heads of a sequence-classification model: the reward model's score of a sequence and
the critic's value at every position, padded or packed.

transformers' sequence classifier maps every hidden state to a scalar and pools one: the
rightmost token that is not the pad id (so left and right padding both work). A packed forward
(`hindsight.maths.packing`) lays rows end to end with positions restarting, reads the head at every
position and takes, for each row, the position that rule names: the padded forward's score on
fewer tokens.
"""
from __future__ import annotations

import torch

from hindsight.maths.experience import Experience, lengths, micro_batches, trimmed
from hindsight.maths.logprobs import compute_autocast, model_device, position_ids
from hindsight.maths.packing import pack, worth_packing


def score_head(model):
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if head is not None:
            return head
    raise TypeError(f"{type(model).__name__}: no score/classifier head to read values from")


def per_position(model, **inputs) -> torch.Tensor:
    """(rows, L) the head's output at every position of one forward. Read inside the model's own
    forward (a hook), not by calling the backbone and the head apart: under FSDP2 only the root
    forward gathers the weights the head and embeddings keep at the root."""
    seen = {}
    hook = score_head(model).register_forward_hook(lambda _m, _i, out: seen.__setitem__("scores", out))
    try:
        with compute_autocast(model):
            model(**inputs, use_cache=False)
    finally:
        hook.remove()
    return seen["scores"].squeeze(-1)


def pooled_columns(input_ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B,) the column transformers' sequence classifier pools: the rightmost token that is not
    `pad_id` (0 for a row of nothing but pad)."""
    cols = torch.arange(input_ids.size(1), device=input_ids.device)                    # (L,)
    return (cols * (input_ids != pad_id)).argmax(-1)                                  # (B,)


def packs_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: str) -> bool:
    """Whether the scores run packed: `on`, or `auto` and the gate finds it saves tokens; never
    when the padded forward would pool a padding position (a pad id the tokens do not use, or
    none), which a packed forward cannot reproduce."""
    if packing == "off":
        return False
    pad_id = model.config.get_text_config().pad_token_id
    if pad_id is None:
        return False
    cols = pooled_columns(input_ids, pad_id)                                            # (B,)
    if not attention_mask.bool().gather(1, cols[:, None]).all():
        return False
    return packing == "on" or worth_packing(attention_mask, 0)


def sequence_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: str = "off") -> torch.Tensor:
    """Scalar reward-model scores, (B,), for right- or left-padded sequences. `packing` as
    `rl.learner.packing`."""
    if packs_scores(model, input_ids, attention_mask, packing):
        return packed_sequence_scores(model, input_ids, attention_mask)
    dev = model_device(model)
    input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids(attention_mask))
    return out.logits.squeeze(-1).float()


def packed_sequence_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """`sequence_scores` on the rows packed end to end: input_ids, attention_mask (B, L) with each
    row's real tokens contiguous. (B,)"""
    input_ids, mask = input_ids.cpu(), attention_mask.cpu()
    cols = pooled_columns(input_ids, model.config.get_text_config().pad_token_id)      # (B,)
    before = mask.long().cumsum(-1).gather(1, cols[:, None]).squeeze(1) - 1      # (B,) real tokens before it
    packed = pack(input_ids, mask, 0).to(model_device(model))
    scores = per_position(model, input_ids=packed.input_ids, position_ids=packed.position_ids)  # (N, W)
    return scores.reshape(-1)[packed.starts + before.to(scores.device)].float()


@torch.no_grad()
def budgeted_scores(model, exp: Experience, budget: int | None, packing: str = "off") -> torch.Tensor:
    """(B,) `sequence_scores` a micro-batch at a time."""
    out = torch.zeros(len(exp), dtype=torch.float32)                                           # (B,)
    for rows in micro_batches(*lengths(exp), exp.group_size, budget):
        part = trimmed(exp, rows)
        out[rows] = sequence_scores(model, part.input_ids, part.attention_mask, packing).cpu()
    return out
