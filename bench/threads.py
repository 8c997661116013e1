"""What a step costs in CPU when the machine is busy: the threads hindsight picks, quiet and loaded.

    python bench/threads.py [--steps 12] [--rounds 3]     # about 3 minutes here

A child process builds the demo's tiny model, sets its intra-op threads as a stage does
(`hindsight.cpus.set_stage_threads`: the affinity mask capped by the cgroup quota, unless
`--threads` says otherwise) and times steps of two kinds:

- `sft`: a forward, backward and AdamW step on 16 x 64 tokens;
- `rl`: 16 rows sampled 24 tokens with `generate`, then a policy-gradient backward and step.

Each kind runs quiet and beside busy processes (one pure-Python spin loop per usable CPU, what a
shared machine's other jobs look like), alternating, and prints the CPU seconds a step (all of
the child's threads, `time.process_time`) and `ratio step_cpu_s loaded/quiet`. Goal: <= 1.3.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# OpenMP's idle threads between parallel regions: libgomp's default (spin ~300,000 rounds, then
# sleep), sleep at once (PASSIVE), or spin 10,000 rounds
# sleep at once (PASSIVE), spin 10,000 rounds, or what hindsight's commands choose at their start:
# PASSIVE where the usable CPUs are already busy, else 10,000 rounds (hindsight.cpus.omp_wait_env)
WAITS = {"default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "spin10k": {"GOMP_SPINCOUNT": "10000"},
         "adaptive": None}
DEFAULT_WAIT = "adaptive"


def worker(kind: str, steps: int, threads: int | None) -> dict:
    import torch

    from hindsight.cpus import set_stage_threads
    from hindsight.models.tiny import build_tiny_model
    from transformers import AutoModelForCausalLM

    n = set_stage_threads(threads)
    path = build_tiny_model(Path(tempfile.mkdtemp()) / "tiny")
    model = AutoModelForCausalLM.from_pretrained(path)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(4, vocab, (16, 64), generator=gen)  # [B=16, T=64]
    cpu, wall = [], []
    for i in range(steps + 2):  # the first two warm up
        c0, w0 = time.process_time(), time.perf_counter()
        if kind == "sft":
            loss = model(input_ids=ids, labels=ids).loss
        else:
            with torch.no_grad():
                out = model.generate(input_ids=ids[:, :8], attention_mask=torch.ones(16, 8, dtype=torch.long),
                                     do_sample=True, max_new_tokens=24, min_new_tokens=24,
                                     pad_token_id=model.config.pad_token_id)  # [B=16, 8+24]
            logp = torch.log_softmax(model(input_ids=out).logits[:, 7:-1].float(), -1)  # [B, 24, V]
            chosen = logp.gather(-1, out[:, 8:, None]).squeeze(-1)  # [B, 24]
            loss = -(chosen.mean(1) * torch.randn(16, generator=gen)).mean()  # advantages stand-in
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i >= 2:
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
    return {"threads": n, "cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall)}


def run_child(kind: str, steps: int, threads: int | None, wait: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--steps", str(steps)]
    if threads:
        cmd += ["--threads", str(threads)]
    from hindsight.cpus import omp_wait_env

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    chosen = WAITS[wait] if WAITS[wait] is not None else omp_wait_env()  # as cli/runtime.env() at a command's start
    env.update(chosen)  # read by OpenMP when torch loads: the child's start
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT, env=env)
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "env": chosen}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", choices=["sft", "rl"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.steps, a.threads)))
        return
    from hindsight.cpus import usable_cpus

    busy = usable_cpus()
    results: dict[tuple[str, str, str], list[dict]] = {}
    for r in range(a.rounds):
        for kind, wait, load in itertools.product(("sft", "rl"), WAITS, ("quiet", "loaded")):
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                        for _ in range(busy if load == "loaded" else 0)]
            try:
                time.sleep(0.5 if spinners else 0)  # the spinners are running when the child's policy is chosen
                res = run_child(kind, a.steps, a.threads, wait)
            finally:
                for p in spinners:
                    p.kill()
                    p.wait()
            results.setdefault((kind, wait, load), []).append(res)
            print(f"round {r} {kind:<3} {wait:<8} {load:<6} threads {res['threads']}  cpu {res['cpu_s'] * 1000:7.1f} ms  "
                  f"wall {res['wall_s'] * 1000:7.1f} ms  {res['env']}", flush=True)
    print(f"\n{busy} usable CPUs, {busy} spinning processes when loaded, {os.cpu_count()} cores on the node")
    for kind, wait in itertools.product(("sft", "rl"), WAITS):
        q, ld = (statistics.median(x["cpu_s"] for x in results[(kind, wait, k)]) for k in ("quiet", "loaded"))
        qw, lw = (statistics.median(x["wall_s"] for x in results[(kind, wait, k)]) for k in ("quiet", "loaded"))
        mark = " (hindsight's default)" if wait == DEFAULT_WAIT else ""
        print(f"{kind} {wait}{mark}: step cpu quiet {q * 1000:.1f} ms, loaded {ld * 1000:.1f} ms; "
              f"wall {qw * 1000:.1f} -> {lw * 1000:.1f} ms")
        print(f"{kind} {wait}: ratio step_cpu_s loaded/quiet: {ld / q:.3f}")


if __name__ == "__main__":
    main()
