"""The tools demo's figures: held-out accuracy before RL (the SFT model) and after (the RL policy),
each with the add tool and without it.

    hindsight run pipeline -c configs/demo-tools.yaml      # in a folder of its own, then there:
    python /path/to/hindsight/bench/tools_demo.py [-c demo-tools.yaml]

"With the tool" is the stage's own evaluation: a greedy trajectory per eval row, the tool's
schema in the prompt and its calls run in the sandbox, the last turn's answer checked. "Without"
is a greedy single-turn answer to the same questions with no tool offered: what the model can
add alone. Both over `eval.limit` held-out sums that never appear in training.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from hindsight.config.pipeline import load_config
    from hindsight.scoring.evaluate import evaluate_path
    from hindsight.state.checkpoint import CheckpointManager
    from hindsight.state.rundir import RunDir

    ap = argparse.ArgumentParser()
    ap.add_argument("-c", "--config", default="demo-tools.yaml")
    args = ap.parse_args()
    cfg = load_config(args.config)
    runs = RunDir.of(cfg)
    ckpt = CheckpointManager(runs.rl.checkpoints)
    last = ckpt.latest_step()
    models = {"SFT (before RL)": str(runs.stage("sft") / "model"), f"RL step {last}": str(ckpt.policy_dir(last))}
    alone = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"rollout": cfg.rl.rollout.model_copy(
        update={"multi_turn": None})})})
    print(f"{'model':<20} {'with the tool':>14} {'without':>9}   ({cfg.eval.limit} held-out sums, greedy)")
    for name, path in models.items():
        with_tool, _ = evaluate_path(cfg, path)
        without, _ = evaluate_path(alone, path)
        print(f"{name:<20} {with_tool:>14.3f} {without:>9.3f}", flush=True)


if __name__ == "__main__":
    main()
