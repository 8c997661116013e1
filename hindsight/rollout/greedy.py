"""Rollouts with transformers' `generate`: every prompt is sampled `group_size` times."""
from __future__ import annotations

import torch

from hindsight.data.chat import prompt_text
from hindsight.experience import Experience, pad_left
from hindsight.logprobs import token_logprobs


def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(B, T) 1 up to and including the first EOS, 0 after it."""
    is_eos = completion_ids == eos_id                                       # (B, T)
    after_eos = (is_eos.cumsum(-1) - is_eos.long()) > 0                     # (B, T) strictly after first EOS
    return (~after_eos).long()


@torch.no_grad()
def generate(model, tok, prompts: list[str], group_size: int, max_new_tokens: int,
             temperature: float = 1.0, top_p: float = 1.0, do_sample: bool = True,
             seed: int | None = None) -> Experience:
    """Sample completions and their behaviour log-probs. Prompts come out in groups of `group_size`."""
    if seed is not None:
        torch.manual_seed(seed)  # per-step seed: a resumed run regenerates the same samples
    seqs = [tok(prompt_text(tok, p), add_special_tokens=False)["input_ids"] for p in prompts]
    prompt_ids, prompt_mask = pad_left([s for s in seqs for _ in range(group_size)], tok.pad_token_id)
    was_training = model.training
    model.eval()
    out = model.generate(
        input_ids=prompt_ids.to(model.device), attention_mask=prompt_mask.to(model.device), max_new_tokens=max_new_tokens,
        do_sample=do_sample, temperature=temperature if do_sample else None,
        top_p=top_p if do_sample else None, top_k=None,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
    )
    out = out.cpu()  # the batch lives on the CPU between steps; models move what they read
    completion_ids = out[:, prompt_ids.size(1):]                             # (B, T)
    mask = completion_mask(completion_ids, tok.eos_token_id)                 # (B, T)
    completion_ids = completion_ids.masked_fill(mask == 0, tok.pad_token_id)
    full_mask = torch.cat([prompt_mask, mask], dim=1)
    logp, _ = token_logprobs(model, out, full_mask, completion_ids.size(1), temperature)
    model.train(was_training)
    return Experience(prompt_ids, prompt_mask, completion_ids, mask, logp.cpu() * mask, group_size)
