"""Does the first half of a run predict where it ends? ScaleRL's claim, checked on hindsight's runs.

    python bench/curve_fit.py                 # the demo's RL stage, evaluated every 2 steps (~3 min)
    python bench/curve_fit.py --run runs/NAME # any finished RL run's own metrics

Fits the saturating curve (`hindsight.lookback.curve`) to the points of the first half of the
run (eval/accuracy, and the per-step reward/mean) with the run's planned samples as the horizon,
predicts the value at the run's last step, and prints the error beside the ±0.03 band ScaleRL
reports. The reward's final value is the mean of the last 5 steps (one step's reward is noisy).
Then the SmolLM2 recipe's curves (docs/benchmarks.md): the documented one, with three eval points,
and a rerun evaluated every 5 steps.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
SMOLLM2 = [(0, 0.160), (20, 0.440), (40, 0.450)]  # docs/benchmarks.md: held-out accuracy by step, 1,280 samples
# the recipe rerun with rl.eval_every=5 and eval.limit=100 (docs/benchmarks.md), the same 40 steps x 32 samples
SMOLLM2_RERUN = [(0, 0.19), (5, 0.23), (10, 0.24), (15, 0.35), (20, 0.46), (25, 0.50), (30, 0.43), (35, 0.43),
                 (40, 0.49)]


def demo_run(steps: int) -> Path:
    from flows.rl import rl_flow
    from flows.sft import sft_flow
    from hindsight.config import load_config

    work = Path(tempfile.mkdtemp(prefix="hindsight-curve-"))
    os.chdir(work)
    sets = [f"tracking.tracking_uri=sqlite:///{work}/mlflow.db", f"data.dir={work}/data", "data.dvc_file=null",
            "reward_model.enabled=false", f"rl.steps={steps}", "rl.eval_every=2", "eval.compare_versions=0"]
    cfg = load_config(ROOT / "configs/demo.yaml", sets)
    sft_flow(cfg)  # the RL stage starts from NAME-sft@latest in the registry
    rl_flow(cfg, force=True)
    return cfg.root


def check(name: str, pts: list[tuple[float, float]], final: float, horizon: float, bounds) -> None:
    from hindsight.lookback.curve import fit_curve

    half = [(x, y) for x, y in pts if x <= horizon / 2]
    fit = fit_curve(*zip(*half), bounds=bounds, horizon=horizon) if len(half) >= 4 else None
    if fit is None:
        print(f"{name}: the first half has {len(half)} points; a fit needs 4 (no prediction)")
        return
    pred = float(fit.predict([horizon])[0])
    print(f"{name}: fitted on {len(half)} points of the first half: asymptote {fit.asymptote:.3f} "
          f"[{fit.asymptote_lo:.3f}, {fit.asymptote_hi:.3f}], predicted at the end {pred:.3f}, measured {final:.3f}, "
          f"error {pred - final:+.3f} (ScaleRL's band ±0.03)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", type=Path, help="a finished RL run directory; default: run the demo")
    ap.add_argument("--steps", type=int, default=40)
    a = ap.parse_args()
    from hindsight.state.rundir import RLDir

    root = a.run or demo_run(a.steps)
    cfg = json.loads(RLDir.find(root).config.read_text())
    per_step = cfg["prompts_per_step"] * cfg["samples_per_prompt"]
    rows = [json.loads(line) for line in RLDir.find(root).metrics.read_text().splitlines()]
    horizon = cfg["steps"] * per_step
    acc = [(r["step"] * per_step, r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
    rew = [(r["step"] * per_step, r["reward/mean"]) for r in rows if "reward/mean" in r]
    print(f"run {root}: {cfg['steps']} steps x {per_step} samples")
    check("eval/accuracy", acc, acc[-1][1], horizon, (0.0, 1.0))
    check("reward/mean", rew, sum(y for _, y in rew[-5:]) / len(rew[-5:]), horizon, None)
    for name, pts in (("documented", SMOLLM2), ("rerun, eval every 5 steps", SMOLLM2_RERUN)):
        check(f"SmolLM2 recipe, {name}, eval/accuracy", [(s * 32, y) for s, y in pts], pts[-1][1], 40 * 32, (0.0, 1.0))


if __name__ == "__main__":
    main()
