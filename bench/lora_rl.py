"""LoRA against full fine-tuning in the RL stage, on the bench model, side by side.

    python bench/lora_rl.py [--steps 12]

Each mode runs in its own process (peak resident memory is per process): the same tiny
Llama (hidden 128, 4 layers, the grpo_vs_trl bench's size), the demo task, GRPO with the KL
penalty (so full fine-tuning holds a reference copy and LoRA does not). Prints trainable
parameters, peak RSS, the training state's bytes (weights, gradients, AdamW moments, the
reference) and samples/s (median over the steps after the first), and the ratios.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def child(mode: str, steps: int, work: Path) -> dict:
    import torch

    from hindsight.config import PipelineConfig
    from hindsight.data.demo import build_demo_data
    from hindsight.models.lora import trainable_parameters
    from hindsight.lookback.metrics import peak_memory
    from hindsight.models.tiny import build_tiny_model
    from hindsight.coordination.run import RLRun

    build_demo_data(work / "data", seed=0)
    init = str(build_tiny_model(work / "base"))
    cfg = PipelineConfig.model_validate({
        "name": "bench", "run_dir": str(work / mode), "seed": 0,
        "data": {"dir": str(work / "data"), "dvc_file": None, "build_demo": False,
                 "prompts": str(work / "data/prompts.jsonl"), "eval": str(work / "data/eval.jsonl")},
        "rl": {"steps": steps, "prompts_per_step": 8, "samples_per_prompt": 8, "lr": 1e-4, "reward_isolation": "inline",
               "save_every": 10_000, "kl": {"coef": 0.04}, "rollout": {"max_new_tokens": 8},
               "lora": {"enabled": mode == "lora", "r": 8, "alpha": 16}}})
    run = RLRun(cfg, init, None)
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        run.rollout(step), run.score(step), run.update(step)
        times.append(time.perf_counter() - t0)
    params = sum(p.numel() for p in run.policy.parameters())
    trainable = trainable_parameters(run.policy)
    ref = 0 if mode == "lora" else sum(p.numel() for p in run.pool.scoring.ref.parameters())
    state_bytes = 4 * (params + 3 * trainable + ref)  # fp32 weights, + grads and 2 AdamW moments per trainable
    samples = cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
    run.close()
    return {"mode": mode, "trainable": trainable, "params": params, "peak_rss_mb": peak_memory()["memory/cpu_peak_mb"],
            "state_mb": state_bytes / 2**20, "samples_per_s": samples / statistics.median(times[1:]),
            "torch_threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--child", choices=["full", "lora"])
    ap.add_argument("--work")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, Path(args.work))))
        return
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("full", "lora"):
            res = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(args.steps), "--work", tmp],
                                 capture_output=True, text=True, check=True)
            out[mode] = json.loads(res.stdout.strip().splitlines()[-1])
    f, lo = out["full"], out["lora"]
    print(f"{'':22s}{'full':>12s}{'lora':>12s}{'lora/full':>12s}")
    for key, label in (("trainable", "trainable params"), ("peak_rss_mb", "peak RSS (MiB)"),
                       ("state_mb", "train state (MiB)"), ("samples_per_s", "samples/s")):
        print(f"{label:22s}{f[key]:12.4g}{lo[key]:12.4g}{lo[key] / f[key]:12.3f}")


if __name__ == "__main__":
    main()
