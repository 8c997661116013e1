"""The shared-prompt update with each group's completions packed after its prompt, against the same
update with them padded, side by side in one process on this CPU.

    python bench/group_packing.py [--repeats 3] [--budget 2048]

One GRPO update (forward, backward, AdamW) on SmolLM2-135M's architecture built from its config
(random weights, no download: hidden 576, 30 layers, 9 heads and 3 key-value heads, vocab 49,152,
tied), the shape of the recipe's step in `bench/real_model.py`: 16 rows in groups of 4, chat
prompts of 36-44 tokens, completions as that bench samples them (a quarter run to the 128-token
cap, the rest end after 8-40 tokens), `rl.learner.micro_batch_tokens: --budget`. Padded
(`logprobs.GROUP_PACKING = False`, the path before) and packed alternate, so the machine's
drift lands on both. Then the same on equal lengths (every completion 128 tokens), where the
cost gate (`group_packing.worth_it`) should keep the padded rows.

The last lines are `ratio update_s padded/group_packed: R` and `gate on equal lengths: ...`.
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

import hindsight.maths.logprobs as logprobs  # noqa: E402
from hindsight.learning.update import LearnerSettings, update  # noqa: E402
from hindsight.maths.experience import Experience, pad_left, pad_right  # noqa: E402

VOCAB = 49152


def smollm2():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         tie_word_embeddings=True, rope_theta=100000.0, pad_token_id=2)
    m = LlamaForCausalLM(config)
    m.compute_dtype = torch.float32
    return m


def batch(completion_lengths: list[int], group: int = 4, seed: int = 0) -> Experience:
    g = torch.Generator().manual_seed(seed)
    n = len(completion_lengths)
    prompts = [torch.randint(3, VOCAB, (int(torch.randint(36, 45, (1,), generator=g)),), generator=g).tolist()
               for _ in range(n // group)]
    prompt_ids, prompt_mask = pad_left([prompts[i // group] for i in range(n)], 2)
    comps = [torch.randint(3, VOCAB, (t,), generator=g).tolist() for t in completion_lengths]
    completion_ids, completion_mask = pad_right(comps, 2)
    logprobs_ = -torch.rand(completion_ids.shape, generator=g) * completion_mask
    rewards = torch.rand(n, generator=g)
    return Experience(prompt_ids, prompt_mask, completion_ids, completion_mask, logprobs_, group, rewards=rewards)


def sampled_lengths(n: int = 16, cap: int = 128, seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    short = torch.randint(8, 41, (n,), generator=g).tolist()
    return [cap if i % 4 == 3 else short[i] for i in range(n)]  # one row of each group runs to the cap


def timed(m, opt, exp: Experience, packed: bool, budget: int) -> float:
    logprobs.GROUP_PACKING = packed
    t0 = time.perf_counter()
    update(m, opt, exp, LearnerSettings(micro_batch_tokens=budget))
    return time.perf_counter() - t0


def side_by_side(m, opt, exp: Experience, budget: int, repeats: int) -> dict:
    times = {False: [], True: []}
    for _ in range(repeats):
        for packed in (False, True):
            times[packed].append(timed(m, opt, exp, packed, budget))
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=int, default=2048, help="rl.learner.micro_batch_tokens")
    args = ap.parse_args()
    torch.set_num_threads(max(torch.get_num_threads(), 1))
    m = smollm2()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-6)
    lengths = sampled_lengths()
    exp = batch(lengths)
    timed(m, opt, exp, False, args.budget)  # AdamW's state and the allocator's first pages
    t = side_by_side(m, opt, exp, args.budget, args.repeats)
    real = int(exp.completion_mask.sum())
    print(f"16 rows in groups of 4, completions {sorted(lengths)} ({real} tokens, mean {real / 16:.0f}), "
          f"budget {args.budget}")
    print(f"padded completions:       {t[False]:6.2f} s/update")
    print(f"group-packed completions: {t[True]:6.2f} s/update")
    equal = batch([128] * 16)
    lengths_t = equal.completion_mask.sum(-1)
    chosen = logprobs._group_packed(m, equal.input_ids, equal.attention_mask, 128, 4) is not None
    e = side_by_side(m, opt, equal, args.budget, 1)
    print(f"equal lengths (all {int(lengths_t[0])}): padded {e[False]:.2f} s, packed-if-cheaper {e[True]:.2f} s")
    print(f"ratio update_s padded/group_packed: {t[False] / t[True]:.2f}")
    print(f"gate on equal lengths: {'packed' if chosen else 'padded'}")


if __name__ == "__main__":
    main()
