"""PPO's value model: a sequence-classification model read out at every token.

A reward model (`AutoModelForSequenceClassification`) already maps each hidden state to a
scalar; it only pools the last one. Reading the head at every position turns it into a
per-token value function, so the critic can start from the trained reward model (the
usual RLHF choice) or from the policy checkpoint with a fresh head.
"""
from __future__ import annotations

import torch

from hindsight.logprobs import at_least_fp32, compute_autocast, position_ids
from hindsight.packing import pack, unpack, worth_packing


def _head(model):
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if head is not None:
            return head
    raise TypeError(f"{type(model).__name__}: no score/classifier head to read values from")


def token_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                 packing: str = "off") -> torch.Tensor:
    """V(s_t) for each completion token: the value of the state just before the token is chosen.

    input_ids, attention_mask: (B, P+T). Returns (B, T), aligned with `token_logprobs`.
    The head's per-position output is read inside the model's own forward (a hook), not by
    calling the backbone and head apart: under FSDP2 only the root forward gathers the weights
    the head and embeddings keep at the root. `packing` as `rl.learner.packing` (0 at masked
    positions when packed).
    """
    dev = next(critic.parameters()).device
    if packing == "on" or (packing == "auto" and worth_packing(attention_mask, n_completion)):
        packed = pack(input_ids.cpu(), attention_mask.cpu(), n_completion).to(dev)
        per_position = _per_position(critic, input_ids=packed.input_ids, position_ids=packed.position_ids)  # (N, W)
        return unpack(at_least_fp32(per_position[packed.keep]), packed, (input_ids.size(0), n_completion))
    input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
    per_position = _per_position(critic, input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids(attention_mask))                   # (B, L)
    return at_least_fp32(per_position[:, -n_completion - 1:-1])                                  # (B, T)


def _per_position(critic, **inputs) -> torch.Tensor:
    """(rows, L) the head's output at every position of one forward."""
    seen = {}
    hook = _head(critic).register_forward_hook(lambda _m, _i, out: seen.__setitem__("scores", out))
    try:
        with compute_autocast(critic):
            critic(**inputs, use_cache=False)
    finally:
        hook.remove()
    return seen["scores"].squeeze(-1)
