"""The policy losses side by side on real work, at equal steps and samples.

    python bench/losses.py --task sum [--steps 30] [--seeds 3]          # the worked-sum tiny task
    python bench/losses.py --task smollm2 [--steps 6] [--eval-limit 40]  # SmolLM2-135M, its recipe

`sum`: one SFT checkpoint (TRL's SFTTrainer), then for each loss and seed the real RL flow on the
long-completion worked sums (16 prompts x 8 samples, 24 new tokens, lr 2e-4, KL 0.02, mini-batches
of 64: two optimizer steps a step), as bench/algorithms.py runs the algorithms. `smollm2`:
configs/examples/smollm2-reasoning.yaml (4 prompts x 8 samples, 64 new tokens, lr 1e-5,
mini-batches of 16) for fewer steps, one seed. In one on-policy pass every loss here has the same
gradient (the ratio is 1, and at 1 the clips, the soft gate and the sequence ratio all pass the
policy gradient unchanged); they differ on the mini-batches after the first, off policy. Each loss keeps its own
defaults (gspo's clip 3e-4/4e-4, cispo's cap 5, sapo's temperatures).

It prints, for each loss: the mean sampled reward over the first and the last 10 steps (or the
first and last half, for fewer than 20 steps), the held-out greedy accuracy after the last step,
and the median step time.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

LOSSES = ["grpo", "dapo", "gspo", "cispo", "sapo"]


def sum_config(work: Path, init: str, loss: str, seed: int, steps: int) -> dict:
    from algorithms import config

    cfg = config(work, init, "grpo", seed, steps)
    cfg["name"], cfg["run_dir"] = f"loss-{loss}-{seed}", str(work / f"{loss}-{seed}")
    rl = cfg["rl"]
    # two optimizer steps a step: on-policy in one pass the losses' gradients coincide (the ratio is 1),
    # so the second mini-batch, off policy, is where they differ
    rl["learner"] = {"lr": rl.pop("lr"), "loss": loss, "mini_batch_size": 64}
    rl["scoring"] = {"rewards": rl.pop("rewards")}
    return cfg


def smollm2_config(work: Path, loss: str, steps: int, eval_limit: int) -> dict:
    import yaml

    cfg = yaml.safe_load((ROOT / "configs/examples/smollm2-reasoning.yaml").read_text())
    cfg["name"], cfg["run_dir"] = f"loss-smollm2-{loss}", str(work / f"smollm2-{loss}")
    cfg["data"]["dir"] = str(work / "data-smollm2")
    cfg["rl"].update(steps=steps, eval_every=10_000, save_every=10_000, report_every=10_000)
    cfg["rl"]["learner"].update(loss=loss, mini_batch_size=16)  # two optimizer steps a step (see sum_config)
    cfg["eval"]["limit"] = eval_limit
    cfg["tracking"] = {"tracking_uri": f"sqlite:///{work}/mlflow.db"}
    return cfg


def run(cfg: dict) -> dict:
    """The RL flow on `cfg`; its held-out accuracy, per-step rewards and step times."""
    from flows.rl import rl_flow
    from hindsight.config import PipelineConfig

    out = rl_flow(PipelineConfig.model_validate(cfg), force=True)
    rows = [json.loads(line) for line in (Path(cfg["run_dir"]) / "rl/metrics.jsonl").read_text().splitlines() if line]
    rows = [r for r in rows if "reward/mean" in r]
    phases = ("runtime/time/rollout_s", "runtime/time/score_s", "runtime/time/update_s")
    return {"accuracy": out.eval_accuracy, "rewards": [r["reward/mean"] for r in rows],
            "step_s": statistics.median(sum(r.get(k, 0.0) for k in phases) for r in rows)}


def window(rewards: list[float]) -> int:
    return 10 if len(rewards) >= 20 else max(1, len(rewards) // 2)


def report(title: str, results: dict[str, list[dict]]) -> None:
    print(f"\n{title}")
    print(f"{'loss':<8}{'reward first':>14}{'reward last':>13}{'accuracy':>10}{'min-max':>15}{'step s':>8}")
    for loss, rs in results.items():
        w = window(rs[0]["rewards"])
        first = statistics.mean(statistics.mean(r["rewards"][:w]) for r in rs)
        last = statistics.mean(statistics.mean(r["rewards"][-w:]) for r in rs)
        accs = [r["accuracy"] for r in rs]
        print(f"{loss:<8}{first:>14.3f}{last:>13.3f}{statistics.mean(accs):>10.3f}"
              f"{f'{min(accs):.3f}-{max(accs):.3f}':>15}{statistics.median(r['step_s'] for r in rs):>8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=["sum", "smollm2"], default="sum")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--eval-limit", type=int, default=40)
    ap.add_argument("--losses", default=",".join(LOSSES))
    a = ap.parse_args()
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    work = Path(tempfile.mkdtemp(prefix="hindsight-losses-"))
    losses = a.losses.split(",")
    results: dict[str, list[dict]] = {name: [] for name in losses}
    if a.task == "sum":
        from grpo_vs_trl import setup

        steps = a.steps or 30
        init, _ = setup(work, "sum")
        for seed in range(a.seeds):  # in turn, so machine drift hits every loss alike
            for loss in losses:
                results[loss].append(run(sum_config(work, init, loss, seed, steps)))
        report(f"worked sums, {steps} steps x 16 prompts x 8 samples, {a.seeds} seeds; held-out accuracy "
               f"(greedy, 200 sums), reward window {window(results[losses[0]][0]['rewards'])} steps", results)
    else:
        steps = a.steps or 6
        for loss in losses:
            results[loss].append(run(smollm2_config(work, loss, steps, a.eval_limit)))
        report(f"SmolLM2-135M-Instruct, chain_sum, {steps} steps x 4 prompts x 8 samples, one seed; held-out "
               f"accuracy (greedy, {a.eval_limit} questions), reward window "
               f"{window(results[losses[0]][0]['rewards'])} steps", results)


if __name__ == "__main__":
    main()
