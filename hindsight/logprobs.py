"""Per-token log-probabilities and entropies of completions under a causal LM."""
from __future__ import annotations

import torch


def model_device(model) -> torch.device:
    """Where a model's weights live; also for a DDP wrapper, which has no `.device`."""
    return next(model.parameters()).device


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) positions that skip left padding, matching what `generate` used."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, n_completion: int,
                   temperature: float = 1.0, with_entropy: bool = False):
    """Log-prob of each completion token given everything before it.

    input_ids, attention_mask: (B, P+T). Returns logp (B, T) and, if asked, entropy (B, T).
    Logits are divided by the sampling temperature, as TRL does, so the ratio against the
    behaviour log-probs is exactly 1 before the first update.
    """
    dev = model_device(model)
    input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids(attention_mask), use_cache=False)
    logits = out.logits[:, -n_completion - 1:-1, :].float() / temperature  # (B, T, V)
    targets = input_ids[:, -n_completion:]                                  # (B, T)
    logsm = torch.log_softmax(logits, dim=-1)                               # (B, T, V)
    logp = logsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)              # (B, T)
    if not with_entropy:
        return logp, None
    entropy = -(logsm.exp() * logsm).sum(-1)                                # (B, T)
    return logp, entropy


def sequence_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scalar reward-model scores, (B,), for right- or left-padded sequences."""
    input_ids, attention_mask = input_ids.to(model.device), attention_mask.to(model.device)
    out = model(input_ids=input_ids, attention_mask=attention_mask,
                position_ids=position_ids(attention_mask))
    return out.logits.squeeze(-1).float()
