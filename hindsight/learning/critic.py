"""PPO's value model: a sequence-classification model read out at every token.

A reward model (`AutoModelForSequenceClassification`) already maps each hidden state to a
scalar; it only pools the last one. Reading the head at every position turns it into a
per-token value function, so the critic can start from the trained reward model (the
usual RLHF choice) or from the policy checkpoint with a fresh head.
"""
from __future__ import annotations

import torch

from hindsight.maths.logprobs import at_least_fp32, position_ids
from hindsight.maths.packing import pack, unpack, worth_packing
from hindsight.maths.scores import per_position


def token_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                 packing: str = "off") -> torch.Tensor:
    """V(s_t) for each completion token: the value of the state just before the token is chosen.

    input_ids, attention_mask: (B, P+T). Returns (B, T), aligned with `token_logprobs`.
    `packing` as `rl.learner.packing` (0 at masked positions when packed).
    """
    dev = next(critic.parameters()).device
    if packing == "on" or (packing == "auto" and worth_packing(attention_mask, n_completion)):
        packed = pack(input_ids.cpu(), attention_mask.cpu(), n_completion).to(dev)
        values = per_position(critic, input_ids=packed.input_ids, position_ids=packed.position_ids)     # (N, W)
        return unpack(at_least_fp32(values[packed.keep]), packed, (input_ids.size(0), n_completion))
    input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
    values = per_position(critic, input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids(attention_mask))                          # (B, L)
    return at_least_fp32(values[:, -n_completion - 1:-1])                                  # (B, T)
