"""What a Prefect task per RL step would cost: the sync RL flow as it ships (one Prefect task
per checkpoint interval, `tasks/rl.steps_task`), the same flow cut into one task per step (as
it was before), and the bare kernel loop, in alternating rounds in one process, on the
long-completion bench task.

    python bench/step_task_cost.py [--rounds 3] [--steps 20]     # about 4 minutes here

All three do the same work (the same prompts and per-group seeds: the completion lengths are
printed).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import grpo_vs_trl as bench  # noqa: E402


def _one_step_spans(start: int, steps: int, save_every: int) -> list[tuple[int, int]]:
    return [(s, s + 1) for s in range(start, steps)]


def main() -> None:
    import flows.rl

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(2)
    work = Path(tempfile.mkdtemp(prefix="hindsight-steptask-"))
    init, rows = bench.setup(work, "sum")
    shipped = flows.rl.checkpoint_spans
    runs: dict[str, list[dict]] = {"flow, a task per interval": [], "flow, a task per step": [], "bare kernel": []}
    for r in range(a.rounds):
        for name in runs:
            if name == "bare kernel":
                runs[name].append(bench.run_kernel(init, rows, a.steps, 0, "sum"))
                continue
            flows.rl.checkpoint_spans = shipped if name.endswith("interval") else _one_step_spans
            runs[name].append(bench.run_flow(init, work, a.steps, 0, "sum", 0, f"{name.split()[-1]}-{r}"))
    flows.rl.checkpoint_spans = shipped
    print(f"\n{a.rounds} rounds x {a.steps} steps, medians over rounds")
    step = {}
    for name, rs in runs.items():
        step[name] = statistics.median(x["step_s"] for x in rs)
        split = rs[0]["split"]
        gen = statistics.median(x["split"]["time/compute/generate_s" if "time/rollout_s" in split else "generate"]
                                for x in rs)
        print(f"{name:<32} step {step[name]:.3f}s  generate {gen:.3f}s  completion tokens "
              f"{statistics.mean(x['length'] for x in rs):.2f}")
    interval, per_step, kernel = step.values()
    print(f"a Prefect task per step costs {(per_step - interval) * 1000:.1f} ms a step "
          f"({(per_step / interval - 1) * 100:.1f}%) more than one per interval")
    print(f"overhead against the bare kernel: one task per interval {(interval / kernel - 1) * 100:.1f}%, "
          f"one per step {(per_step / kernel - 1) * 100:.1f}%")


if __name__ == "__main__":
    main()
