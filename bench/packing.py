"""Padding-free packed micro-batches against padded ones, side by side in one process on this CPU.

    python bench/packing.py [--repeats 5]

One GRPO update (forward, backward, AdamW) on a Qwen2-architecture model built from its config (no
download: hidden 256, 4 layers, vocab 32,000, 20 M parameters), 16 rows in groups of 4: prompts of
24-40 tokens and completions drawn uniformly from 16-256 tokens (mixed, as sampled completions
are), within a budget of `--budget` padded tokens per micro-batch. The padded and packed updates
alternate, so a machine's drift lands on both; tokens per second counts real tokens (prompt +
completion), the same for both.

Then the gate (`rl.learner.packing: auto`) on the same rows and on equal lengths (every
completion 128 tokens): what it chooses and what each path costs there.

Then the reward model's scoring forward (the same architecture with a scalar head, no gradient) on
the mixed rows, padded and packed, alternating.

The last lines are `ratio tokens_per_s packed/padded: A`, `ratio reward_model tokens_per_s
packed/padded: R` and `gate on equal lengths: ...`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hindsight.maths.experience import Experience, pad_left, pad_right  # noqa: E402
from hindsight.learning.update import LearnerSettings, update  # noqa: E402


def config():
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=32000, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                       tie_word_embeddings=True, pad_token_id=0, num_labels=1)


def model():
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(0)
    m = Qwen2ForCausalLM(config())
    m.compute_dtype = torch.float32
    return m


def reward_model_ratio(exp: Experience, budget: int, repeats: int) -> float:
    """Packed over padded real tokens per second of the reward model's scoring forward."""
    from transformers import Qwen2ForSequenceClassification

    from hindsight.maths.scores import budgeted_scores

    torch.manual_seed(0)
    rm = Qwen2ForSequenceClassification(config()).eval()
    times = {"off": [], "on": []}
    for _ in range(repeats + 1):  # the first round warms up
        for mode in ("off", "on"):
            t0 = time.perf_counter()
            budgeted_scores(rm, exp, budget, mode)
            times[mode].append(time.perf_counter() - t0)
    pad_s, pack_s = statistics.median(times["off"][1:]), statistics.median(times["on"][1:])
    print(f"reward model forward: padded {pad_s:.3f} s, packed {pack_s:.3f} s")
    return pad_s / pack_s


def batch(completion_lengths: list[int], group: int = 4, seed: int = 0) -> Experience:
    g = torch.Generator().manual_seed(seed)
    n = len(completion_lengths)
    prompts = [torch.randint(3, 32000, (int(torch.randint(24, 41, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n // group)]
    prompt_ids, prompt_mask = pad_left([prompts[i // group] for i in range(n)], 0)
    comps = [torch.randint(3, 32000, (t,), generator=g).tolist() for t in completion_lengths]
    completion_ids, completion_mask = pad_right(comps, 0)
    logprobs = -torch.rand(completion_ids.shape, generator=g) * completion_mask
    rewards = torch.rand(n, generator=g)
    return Experience(prompt_ids, prompt_mask, completion_ids, completion_mask, logprobs, group, rewards=rewards)


def timed_update(m, opt, exp: Experience, packing: str, budget: int) -> tuple[float, dict]:
    s = LearnerSettings(micro_batch_tokens=budget, packing=packing)
    t0 = time.perf_counter()
    metrics = update(m, opt, exp, s)
    return time.perf_counter() - t0, metrics


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=int, default=2400, help="padded tokens per micro-batch")
    args = ap.parse_args()
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    g = torch.Generator().manual_seed(1)
    mixed = torch.randint(16, 257, (16,), generator=g).tolist()
    exp = batch(mixed)
    real = int(exp.prompt_mask.sum() + exp.completion_mask.sum())
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-6)
    timed_update(m, opt, exp, "off", args.budget)  # AdamW's state and the allocator's first pages
    times = {"off": [], "on": []}
    for _ in range(args.repeats):
        for mode in ("off", "on"):
            dt, metrics = timed_update(m, opt, exp, mode, args.budget)
            times[mode].append(dt)
    pad_s, pack_s = statistics.median(times["off"]), statistics.median(times["on"])
    print(f"rows 16 (groups of 4), completions {min(mixed)}-{max(mixed)} tokens, {real} real tokens, "
          f"budget {args.budget}, padding fraction {metrics['learn/padding_fraction']:.2f}, "
          f"micro-batches {metrics['learn/micro_batches']:.0f}")
    print(f"padded: {pad_s:6.2f} s/update  {real / pad_s:8.0f} tokens/s   runs {', '.join(f'{t:.2f}' for t in times['off'])}")
    print(f"packed: {pack_s:6.2f} s/update  {real / pack_s:8.0f} tokens/s   runs {', '.join(f'{t:.2f}' for t in times['on'])}")
    _gate(m, opt, exp, args.budget, "mixed lengths")
    equal = batch([128] * 16)
    eq = {mode: statistics.median(timed_update(m, opt, equal, mode, args.budget)[0] for _ in range(2))
          for mode in ("off", "on")}
    choice = _gate(m, opt, equal, args.budget, "equal lengths")
    print(f"equal lengths: padded {eq['off']:.2f} s, packed {eq['on']:.2f} s (packed/padded time "
          f"{eq['on'] / eq['off']:.2f})")
    rm_ratio = reward_model_ratio(exp, args.budget, args.repeats)
    print(f"ratio tokens_per_s packed/padded: {pad_s / pack_s:.2f}")
    print(f"ratio reward_model tokens_per_s packed/padded: {rm_ratio:.2f}")
    print(f"gate on equal lengths: {'packed' if choice else 'padded'}")


def _gate(m, opt, exp: Experience, budget: int, what: str) -> bool:
    _, metrics = timed_update(m, opt, exp, "auto", budget)
    print(f"gate (auto) on {what}: packed {metrics['learn/packing']:.0%} of micro-batches")
    return metrics["learn/packing"] > 0


if __name__ == "__main__":
    main()
