"""One decoding contract for the RL sampler and evaluation.

Both decode with `rollout.hf.sample_groups` (evaluation at temperature 0) and stop at the same
end tokens: the tokenizer's eos plus every `eos_token_id` of the model's generation config, as
an instruct model ends its turn with one of several (Qwen2.5: `<|im_end|>` and `<|endoftext|>`).

Everything else comes from the config (`rl.rollout`, `eval`), never from the checkpoint's
generation config: a repetition penalty or top-k there would make evaluation decode
differently from training. What the checkpoint sets and hindsight does not apply is stated
(`ignored_settings`), and each run logs what it used (`decoding_record`).
"""
from __future__ import annotations

import torch

# generation-config fields that change which token is picked; hindsight applies temperature
# and top_p from its own config and none of these
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "typical_p", "repetition_penalty",
                    "no_repeat_ngram_size", "num_beams", "do_sample", "length_penalty", "epsilon_cutoff", "eta_cutoff")


def end_token_ids(tok, model=None) -> tuple[int, ...]:
    """The ids decoding stops at: the tokenizer's eos and the model's generation config's, sorted.
    `model` may be a model or a `GenerationConfig`."""
    ids = set() if tok.eos_token_id is None else {int(tok.eos_token_id)}
    eos = getattr(_generation_config(model), "eos_token_id", None)
    ids |= {int(e) for e in ([eos] if isinstance(eos, int) else eos or [])}
    if not ids:
        raise ValueError("the tokenizer has no eos token and the model's generation config lists none: "
                         "decoding would never stop")
    return tuple(sorted(ids))


def _generation_config(model):
    from transformers import GenerationConfig

    return model if isinstance(model, GenerationConfig) else getattr(model, "generation_config", None)


def ignored_settings(model) -> dict:
    """What the checkpoint's generation config sets, away from transformers' defaults, that
    hindsight's decoding does not apply (temperature and top_p come from the config)."""
    from transformers import GenerationConfig

    gen = _generation_config(model)
    if gen is None:
        return {}
    default = GenerationConfig()
    return {k: getattr(gen, k) for k in _SAMPLING_FIELDS
            if getattr(gen, k, None) is not None and getattr(gen, k) != getattr(default, k, None)}


def decoding_record(tok, model, eval_cfg, rollout=None) -> dict:
    """The decoding a run used, as it is logged (an MLflow tag; the RL stage also writes it to its
    run directory). `rollout` is the RL sampler's section; a stage without one only evaluates."""
    stops = end_token_ids(tok, model)
    record = {"stop_token_ids": list(stops), "stop_tokens": tok.convert_ids_to_tokens(list(stops)),
              "eval": {"temperature": 0.0, "max_new_tokens": eval_cfg.max_new_tokens},
              "checkpoint_settings_not_applied": ignored_settings(model)}
    if rollout is not None:
        record["rl"] = {"temperature": rollout.temperature, "top_p": rollout.top_p,
                        "max_new_tokens": rollout.max_new_tokens}
    return record


def describe(record: dict) -> str:
    """One line for the console: where decoding stops and what the checkpoint asked for that is not used."""
    line = f"decoding stops at {', '.join(record['stop_tokens'])}"
    ignored = record["checkpoint_settings_not_applied"]
    if ignored:
        line += ("; the checkpoint's generation_config also sets " + ", ".join(f"{k}={v}" for k, v in ignored.items())
                 + ": not applied (rl.rollout and eval set the decoding)")
    return line


def completion_mask(completion_ids: torch.Tensor, stop_ids) -> torch.Tensor:
    """(B, T) 1 up to and including the first end token (any of `stop_ids`), 0 after it."""
    stops = torch.tensor([stop_ids] if isinstance(stop_ids, int) else list(stop_ids), dtype=completion_ids.dtype)
    is_end = torch.isin(completion_ids, stops)                               # (B, T)
    after_end = (is_end.cumsum(-1) - is_end.long()) > 0                      # (B, T) strictly after the first
    return (~after_end).long()
