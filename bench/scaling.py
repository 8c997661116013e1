"""Scaling the RL stage's roles on this machine, measured side by side in one run.

    python bench/scaling.py [--steps 4]

1. Rollout throughput: samples/s of N = 1 and N = 2 rollout workers (Ray actors), the same
   groups (each group's seed is its own, so both sample the same tokens).
2. Update step: P = 2 learners in one process group for the stage (this process and a Ray
   actor), replicated (`ddp`) against sharded (`fsdp2`: every forward gathers each layer's
   weights, and the update ends by gathering the full weights for the rollout copy), the same
   batches. (The per-step `accelerate launch` this used to be compared with is gone; it cost
   68x the group's step.)

Medians over the steps after the first (which pays start-up), and the ratios.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def reward(completions, **_):
    return [float(len(c) % 3) for c in completions]


def config(work: Path, run_dir: Path, steps: int, **overrides):
    from hindsight.config import PipelineConfig

    rl = {"steps": steps, "prompts_per_step": 8, "samples_per_prompt": 8, "reward_isolation": "inline", "lr": 1e-3,
          "save_every": 1000, "kl": {"coef": 0.0}, "rollout": {"max_new_tokens": 16},
          "rewards": [{"fn": "scaling:reward"}], **overrides.pop("rl", {})}
    return PipelineConfig.model_validate({
        "name": "scaling", "seed": 0, "run_dir": str(run_dir),
        "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
        "sft": {"batch_size": 8}, "reward_model": {"batch_size": 8}, "rl": rl, **overrides})


def timed_steps(cfg, init: str, steps: int, phase: str) -> tuple[list[float], int]:
    from hindsight.coordination.run import RLRun

    run = RLRun(cfg, init, None)
    times, samples = [], 0
    for step in range(steps):
        t0 = time.perf_counter()
        run.rollout(step)
        rollout_s = time.perf_counter() - t0
        run.score(step)
        t0 = time.perf_counter()
        run.update(step)
        update_s = time.perf_counter() - t0
        times.append(rollout_s if phase == "rollout" else update_s)
        samples = len(run.store.read("rollouts", step))
    run.close()
    return times[1:], samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from hindsight.data.demo import build_demo_data
    from hindsight.models.tiny import build_tiny_model

    work = Path(tempfile.mkdtemp(prefix="hindsight-scaling-"))
    build_demo_data(work / "data", seed=0)
    init = str(build_tiny_model(work / "init", hidden=64, layers=2, heads=2))

    rates = {}
    for n in (1, 2):
        cfg = config(work, work / f"rollout{n}", args.steps, rl={"workers": {"placement": "ray", "rollout": n}})
        times, samples = timed_steps(cfg, init, args.steps, "rollout")
        rates[n] = samples / statistics.median(times)
        print(f"rollout workers N={n}: {rates[n]:.1f} samples/s (median of {len(times)} steps, {samples} samples a step)")
    print(f"ratio N=2/N=1 samples_per_s: {rates[2] / rates[1]:.2f}")

    steps = {}
    for strategy in ("ddp", "fsdp2"):
        workers = {"placement": "ray", "learner": 2, "learner_strategy": strategy}
        times, _ = timed_steps(config(work, work / strategy, args.steps, rl={"workers": workers}), init, args.steps,
                               "update")
        steps[strategy] = statistics.median(times)
    print(f"update step, P=2 learner group: ddp {steps['ddp']:.2f} s, fsdp2 {steps['fsdp2']:.2f} s")
    print(f"ratio fsdp2/ddp step_time: {steps['fsdp2'] / steps['ddp']:.2f}")


if __name__ == "__main__":
    main()
