"""Did the run learn? The base model and a finished RL run on the same held-out questions.

    python bench/learning_curve.py -c configs/examples/smollm2-reasoning.yaml [--run runs/NAME] [--png FILE]

Reads the run's own `eval/accuracy` (the config's evaluation: its held-out questions, greedy
decoding, token budget and reward; the run measures its starting model at step 0) and its
`reward/mean` at every step from `rl/metrics.jsonl`, and prints each accuracy with its standard
error and the gain over the base in standard errors of the difference. `--png` draws
the curve: the training reward (a moving average) and the held-out accuracy, base at step 0.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def se(acc: float, n: int) -> float:
    return (acc * (1 - acc) / max(n, 1)) ** 0.5


def history(run_dir: Path) -> tuple[dict[int, float], dict[int, float]]:
    """(steps done -> eval/accuracy, steps done -> reward/mean) from the run's own metrics file."""
    from hindsight.state.rundir import RLDir

    accuracy, reward = {}, {}
    for line in RLDir.find(run_dir).metrics.read_text().splitlines():
        row = json.loads(line)
        done = int(row["step"])
        if "eval/accuracy" in row:
            accuracy[done] = float(row["eval/accuracy"])
        if "reward/mean" in row:
            reward[done] = float(row["reward/mean"])
    return accuracy, reward


def plot(path: Path, base: float, n: int, accuracy: dict[int, float], reward: dict[int, float], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted(reward)
    window = 5
    smooth = [sum(reward[s] for s in steps[max(0, i - window + 1):i + 1]) / len(steps[max(0, i - window + 1):i + 1])
              for i in range(len(steps))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [reward[s] for s in steps], color="#bbb", lw=0.8, label="train reward (per step)")
    ax.plot(steps, smooth, color="#555", lw=1.5, label=f"train reward ({window}-step mean)")
    points = [(0, base), *sorted(accuracy.items())]
    ax.errorbar([s for s, _ in points], [a for _, a in points], yerr=[2 * se(a, n) for _, a in points], fmt="o-",
                color="#1f77b4", capsize=3, label=f"held-out accuracy ({n} questions, greedy; bars 2 SE)")
    ax.set_xlabel("RL step")
    ax.set_ylabel("accuracy / reward")
    ax.set_title(title)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-c", "--config", required=True, type=Path)
    ap.add_argument("--run", type=Path, help="the run directory (default: the config's)")
    ap.add_argument("--png", type=Path)
    a = ap.parse_args()
    from hindsight.config import load_config

    cfg = load_config(a.config)
    accuracy, reward = history(a.run or cfg.root)
    if 0 not in accuracy:
        sys.exit(f"{a.run or cfg.root}: no step-0 evaluation of the starting model in its metrics")
    base, n = accuracy.pop(0), cfg.eval.limit
    print(f"{cfg.name}: held-out {n} questions ({cfg.data.eval}), greedy, {cfg.eval.max_new_tokens} new tokens")
    print(f"{'step':>6}{'accuracy':>10}{'SE':>8}{'gain / SE':>11}")
    print(f"{0:>6}{base:>10.3f}{se(base, n):>8.3f}{'(base)':>11}")
    for step, acc in sorted(accuracy.items()):
        gain = (acc - base) / ((se(acc, n) ** 2 + se(base, n) ** 2) ** 0.5 or 1.0)
        print(f"{step:>6}{acc:>10.3f}{se(acc, n):>8.3f}{gain:>11.1f}")
    if reward:
        first, last = sorted(reward)[:10], sorted(reward)[-10:]
        print(f"train reward: first 10 steps {sum(reward[s] for s in first) / len(first):.3f}, "
              f"last 10 {sum(reward[s] for s in last) / len(last):.3f}")
    if a.png:
        plot(a.png, base, n, accuracy, reward, f"{cfg.name}: RL on a real model (CPU)")
        print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
