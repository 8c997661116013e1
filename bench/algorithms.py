"""The four RL algorithms on the long-completion worked-sum task (`hindsight/data/sumtask.py`).

    python bench/algorithms.py [--steps 30] [--seeds 3]

One SFT checkpoint (TRL's SFTTrainer, here), then for each algorithm and seed the real RL flow
(16 prompts x 8 samples, 24 new tokens, lr 2e-4, KL 0.02 in the loss): held-out accuracy
(greedy, on the 200 eval sums, none seen in training) after the last step, and the stage's
wall time. The table shows the mean and the min-max over seeds; the SFT checkpoint's own
accuracy is the baseline.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ALGORITHMS = {"grpo": {}, "rloo": {}, "reinforce_pp": {}, "ppo": {"ppo": {"critic_init": "policy", "critic_lr": 1e-3}}}


def config(work: Path, init: str, algorithm: str, seed: int, steps: int) -> dict:
    reward = "rewards.exact:final_answer"
    return {
        "name": f"alg-{algorithm}-{seed}", "run_dir": str(work / f"{algorithm}-{seed}"), "seed": seed,
        "data": {"dir": str(work / "data"), "dvc_file": None, "build_demo": False,
                 "prompts": str(work / "data/prompts.jsonl"), "eval": str(work / "data/eval.jsonl")},
        "rl": {"init": init, "algorithm": algorithm, "steps": steps, "prompts_per_step": 16, "samples_per_prompt": 8,
               "lr": 2e-4, "kl": {"coef": 0.02}, "rewards": [{"fn": reward}],
               "rollout": {"max_new_tokens": 24, "groups_per_batch": 16},
               "eval_every": 10_000, "save_every": 10_000, "report_every": 10_000, **ALGORITHMS[algorithm]},
        "eval": {"limit": 200, "max_new_tokens": 24, "reward": reward, "compare_versions": 0},
        "tracking": {"tracking_uri": f"sqlite:///{work}/mlflow.db"}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args()
    import torch

    from flows.rl import rl_flow
    from grpo_vs_trl import setup
    from hindsight.config import PipelineConfig
    from hindsight.scoring.evaluate import evaluate_path

    torch.set_num_threads(os.cpu_count() or 1)
    work = Path(tempfile.mkdtemp(prefix="hindsight-algorithms-"))
    init, _ = setup(work, "sum")
    baseline, _ = evaluate_path(PipelineConfig.model_validate(config(work, init, "grpo", 0, a.steps)), init)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ALGORITHMS}
    for seed in range(a.seeds):  # in turn, so machine drift hits every algorithm alike
        for name in ALGORITHMS:
            t0 = time.perf_counter()
            out = rl_flow(PipelineConfig.model_validate(config(work, init, name, seed, a.steps)), force=True)
            results[name].append((out.eval_accuracy, time.perf_counter() - t0))
    print(f"\nworked sums, {a.steps} steps x 16 prompts x 8 samples, {a.seeds} seeds; held-out accuracy "
          f"(greedy, 200 sums) after SFT: {baseline:.3f}")
    print(f"{'algorithm':<14}{'accuracy':>10}{'min-max':>16}{'wall s':>9}")
    for name, rs in results.items():
        accs = [r[0] for r in rs]
        print(f"{name:<14}{statistics.mean(accs):>10.3f}{f'{min(accs):.3f}-{max(accs):.3f}':>16}"
              f"{statistics.median(r[1] for r in rs):>9.1f}")


if __name__ == "__main__":
    main()
