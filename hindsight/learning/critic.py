"""PPO's value model: a sequence-classification model read out at every token.

A reward model (`AutoModelForSequenceClassification`) already maps each hidden state to a
scalar; it only pools the last one. Reading the head at every position turns it into a
per-token value function, so the critic can start from the trained reward model (the
usual RLHF choice) or from the policy checkpoint with a fresh head.
"""
from __future__ import annotations

import torch

from hindsight.logprobs import at_least_fp32, compute_autocast, position_ids


def _head(model):
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if head is not None:
            return head
    raise TypeError(f"{type(model).__name__}: no score/classifier head to read values from")


def token_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int) -> torch.Tensor:
    """V(s_t) for each completion token: the value of the state just before the token is chosen.

    input_ids, attention_mask: (B, P+T). Returns (B, T), aligned with `token_logprobs`.
    """
    input_ids, attention_mask = input_ids.to(critic.device), attention_mask.to(critic.device)
    backbone = getattr(critic, critic.base_model_prefix)
    with compute_autocast(critic):
        hidden = backbone(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids(attention_mask), use_cache=False).last_hidden_state  # (B, L, H)
        states = hidden[:, -n_completion - 1:-1, :]                                                 # (B, T, H)
        return at_least_fp32(_head(critic)(states).squeeze(-1))                                     # (B, T)
