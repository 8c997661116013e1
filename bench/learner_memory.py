"""The learner's memory as a token budget, measured side by side on this CPU.

    python bench/learner_memory.py [--quick]

One RL update (GRPO, AdamW) on a Qwen2-architecture model built from its config (no download):
hidden 256, 4 layers, vocab 32,000 (20 M parameters), prompts of 32 and completions of up to 128
tokens. Each measurement runs in a fresh process, after a first update that allocates AdamW's
state (a run holds it throughout): the peak resident memory of the next update (VmHWM, reset
just before it) minus the resident memory just before it, so a measurement never inherits
another's pages (see MALLOC for how freed memory is returned).

1. The step grows 1x -> 8x (8 -> 64 rows) at a fixed `micro_batch_tokens`: the peak stays.
2. The same without micro-batches, for contrast: the peak grows with the step.
3. Activation checkpointing against none on a 16-layer model, at the same budget.
4. Step time of micro-batched (half the activation memory: 2 micro-batches) against whole-batch
   at the same work, when both fit.

5. The FSDP2 learner (`rl.learner.strategy: fsdp2`): the per-rank peak of a step on a
   model whose weights, gradients and AdamW state dominate (65 M parameters, a small batch), one
   rank against each of two gloo ranks. A rank's peak is its resident peak during the step minus
   its resident memory before the model was built, so the state it keeps counts.

The last lines are `ratio peak_memory 8x/1x: X`, `ratio step_time micro/whole: Y` and
`ratio rank_peak fsdp2 P2/P1: Z`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# glibc keeps freed heap pages and fragments it between differently shaped tensors, so a process's
# resident peak overstates what its tensors needed; served from mmap, every tensor above 64 KB is
# returned when freed, and the peak is the tensors' (a GPU's caching allocator reports the same).
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
SHAPE = {"hidden": 256, "layers": 4, "vocab": 32000, "prompt": 32, "completion": 128, "group": 4}


def build(layers: int, checkpointing: bool):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hindsight.config import ModelConfig
    from hindsight.models.compat import enable_checkpointing

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=SHAPE["vocab"], hidden_size=SHAPE["hidden"], intermediate_size=SHAPE["hidden"] * 4,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    model.compute_dtype = torch.float32
    if checkpointing:  # what learning.build does for model.gradient_checkpointing
        enable_checkpointing(model)
    _ = ModelConfig  # the settings these stand for: model.dtype float32, model.gradient_checkpointing
    return model


def batch(rows: int, seed: int = 0, vocab: int = SHAPE["vocab"]):
    """A stored step's batch: random tokens, completions of 96..128 tokens with one of each group
    cut at 128 (a step always has rows that ran to max_new_tokens), a group's prompt shared."""
    import torch

    from hindsight.maths.experience import Experience

    g = torch.Generator().manual_seed(seed)
    p, t, size = SHAPE["prompt"], SHAPE["completion"], SHAPE["group"]
    prompts = torch.randint(5, vocab, (rows // size, p), generator=g).repeat_interleave(size, 0)          # (B, P)
    completions = torch.randint(5, vocab, (rows, t), generator=g)                                        # (B, T)
    ends = torch.randint(3 * t // 4, t + 1, (rows,), generator=g)                                         # (B,)
    ends[::size] = t
    mask = (torch.arange(t)[None, :] < ends[:, None]).long()                                              # (B, T)
    exp = Experience(prompts, torch.ones_like(prompts), completions * mask, mask,
                     -torch.rand(rows, t, generator=g) * mask, size)
    exp.rewards = torch.rand(rows, generator=g)
    return exp


def one(spec: dict) -> dict:
    """In this (fresh) process: build, then one update; its extra peak memory and its time."""
    import torch

    from hindsight.learning.losses.objective import Objective
    from hindsight.learning.update import LearnerSettings, update

    torch.set_num_threads(spec.get("threads", 2))
    model = build(spec["layers"], spec["checkpointing"])
    exp = batch(spec["rows"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    s = LearnerSettings(micro_batch_tokens=spec["budget"], loss=Objective(kl_coef=0.0, max_len=SHAPE["completion"]))
    update(model, opt, batch(SHAPE["group"], seed=1), s)  # a first step allocates AdamW's state: a run holds it
    before = _rss_kb()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak from here on
    t0 = time.perf_counter()
    metrics = update(model, opt, exp, s)
    seconds = time.perf_counter() - t0
    return {**spec, "extra_mb": (_status_kb("VmHWM") - before) / 1024, "seconds": seconds,
            "micro_batches": metrics["learn/micro_batches"], "padding": metrics["learn/padding_fraction"]}


# weights, gradients and AdamW's two moments of 65 M parameters (1,040 MB in fp32) against a step of
# 8 rows: the state is what sharding divides
FSDP_SHAPE = {"hidden": 512, "layers": 16, "vocab": 8000, "rows": 8}


def fsdp_rank(spec: dict) -> dict:
    """One rank of an FSDP2 learner group of `world` (gloo): build, shard, two updates; the
    second's resident peak above this process's memory before the model existed."""
    import torch
    import torch.distributed as dist
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hindsight.config import LearnerConfig
    from hindsight.learning.losses.objective import Objective
    from hindsight.learning.strategies import sharded as sharding
    from hindsight.learning.update import LearnerSettings, update

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{spec['port']}", rank=spec["rank"],
                            world_size=spec["world"])
    base = _rss_kb()
    torch.manual_seed(0)
    h = FSDP_SHAPE["hidden"]
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=FSDP_SHAPE["vocab"], hidden_size=h, intermediate_size=h * 4,
                                         num_hidden_layers=FSDP_SHAPE["layers"], num_attention_heads=8,
                                         num_key_value_heads=2, tie_word_embeddings=True))
    model.compute_dtype = torch.float32
    params = sum(p.numel() for p in model.parameters())
    model = sharding.shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    s = LearnerSettings(micro_batch_tokens=2 * (SHAPE["prompt"] + SHAPE["completion"]),
                        loss=Objective(kl_coef=0.0, max_len=SHAPE["completion"]))
    share = sharding.Sharded(spec["rank"], spec["world"], LearnerConfig(strategy="fsdp2"))
    exp = lambda: batch(FSDP_SHAPE["rows"], vocab=FSDP_SHAPE["vocab"])  # noqa: E731
    update(model, opt, exp(), s, share=share)  # allocates AdamW's state
    Path("/proc/self/clear_refs").write_text("5")
    t0 = time.perf_counter()
    update(model, opt, exp(), s, share=share)
    seconds = time.perf_counter() - t0
    peak = (_status_kb("VmHWM") - base) / 1024
    dist.destroy_process_group()
    return {**spec, "rank_peak_mb": peak, "seconds": seconds, "params_m": params / 1e6}


def fsdp_group(world: int) -> list[dict]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, **MALLOC}
    procs = [subprocess.Popen([sys.executable, __file__, "--fsdp", json.dumps({"rank": r, "world": world, "port": port})],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env) for r in range(world)]
    out = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"an fsdp2 rank failed: {[p.returncode for p in procs]}")
    return out


def _status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def _rss_kb() -> int:
    return _status_kb("VmRSS")


def measure(**spec) -> dict:
    spec = {"layers": SHAPE["layers"], "checkpointing": False, "budget": None, **spec}
    env = {**os.environ, **MALLOC}
    out = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], capture_output=True, text=True,
                         check=True, cwd=ROOT, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def show(label: str, r: dict) -> None:
    print(f"{label:<44} rows {r['rows']:>3}  budget {str(r['budget']):>5}  micro-batches {r['micro_batches']:>4.0f}  "
          f"extra peak {r['extra_mb']:8.1f} MB  step {r['seconds']:6.2f} s  padding {r['padding']:.1%}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--fsdp", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="one timing round instead of three")
    ap.add_argument("--only-fsdp2", action="store_true", help="only part 5, the FSDP2 per-rank peak")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    if args.fsdp:
        print(json.dumps(fsdp_rank(json.loads(args.fsdp))))
        return
    if args.only_fsdp2:
        fsdp2_ratio()
        return
    budget = 2 * (SHAPE["prompt"] + SHAPE["completion"])  # two sequences per micro-batch: 320 tokens
    print(f"model: Qwen2 hidden {SHAPE['hidden']}, vocab {SHAPE['vocab']}, prompt {SHAPE['prompt']}, "
          f"completion <= {SHAPE['completion']}; micro_batch_tokens {budget}", flush=True)
    micro = {n: measure(rows=n, budget=budget) for n in (8, 64)}
    for n, r in micro.items():
        show(f"micro-batched, step {n // 8}x", r)
    whole = {n: measure(rows=n) for n in (8, 64)}
    for n, r in whole.items():
        show(f"whole batch, step {n // 8}x", r)
    deep = {c: measure(rows=8, budget=budget * 2, layers=16, checkpointing=c) for c in (False, True)}
    show("16 layers, no checkpointing", deep[False])
    show("16 layers, activation checkpointing", deep[True])
    rounds = 1 if args.quick else 5
    times = {"micro": [], "whole": []}
    for _ in range(rounds):  # alternated, so drift on a noisy machine hits both
        times["whole"].append(measure(rows=16)["seconds"])
        times["micro"].append(measure(rows=16, budget=8 * (SHAPE["prompt"] + SHAPE["completion"]))["seconds"])
    tw, tm = statistics.median(times["whole"]), statistics.median(times["micro"])
    print(f"step time, 16 rows (median of {rounds}): whole {tw:.2f} s, in 2 micro-batches of 8 rows {tm:.2f} s")
    print(f"ratio peak_memory whole 8x/1x: {whole[64]['extra_mb'] / whole[8]['extra_mb']:.2f}")
    print(f"ratio peak_memory checkpointing/none (16 layers): {deep[True]['extra_mb'] / deep[False]['extra_mb']:.2f}")
    print(f"ratio peak_memory 8x/1x: {micro[64]['extra_mb'] / micro[8]['extra_mb']:.2f}")
    print(f"ratio step_time micro/whole: {tm / tw:.2f}")
    fsdp2_ratio()


def fsdp2_ratio() -> None:
    one_rank, two_ranks = fsdp_group(1), fsdp_group(2)
    print(f"fsdp2, {one_rank[0]['params_m']:.0f} M parameters, {FSDP_SHAPE['rows']} rows a step:")
    for r in one_rank + two_ranks:
        print(f"  P={r['world']} rank {r['rank']}: peak {r['rank_peak_mb']:7.1f} MB  step {r['seconds']:.2f} s", flush=True)
    worst = max(r["rank_peak_mb"] for r in two_ranks)  # the rank that must fit its device
    print(f"ratio rank_peak fsdp2 P2/P1: {worst / one_rank[0]['rank_peak_mb']:.2f}")


if __name__ == "__main__":
    main()
