"""What writing trajectories as MLflow traces costs a step: the demo's RL stage (configs/demo.yaml,
its SFT model as init) with `lookback.traces_per_step` at its default and at 0, in alternating
rounds in one process, each timed by the gaps between its steps' metric timestamps.

    python bench/traces.py [--rounds 3] [--steps 20]     # about 4 minutes here

Prints each run's median step time, the traces written, and `ratio step_time traces/none`. Both
arms keep the evaluations' traces (every 10 steps; the median step leaves those steps out).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def step_time(client, run_id: str) -> float:
    stamps = sorted((m.step, m.timestamp / 1000) for m in client.get_metric_history(run_id, "reward/mean"))
    return statistics.median(b[1] - a[1] for a, b in zip(stamps, stamps[1:]))


def main() -> None:
    import mlflow
    from mlflow.tracking import MlflowClient

    from flows.rl import rl_flow
    from flows.sft import sft_flow
    from hindsight.config import load_config

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hindsight-traces-"))
    os.chdir(work)
    uri = f"sqlite:///{work}/mlflow.db"
    base = [f"tracking.tracking_uri={uri}", f"data.dir={work}/data", "data.dvc_file=null", "reward_model.enabled=false",
            f"rl.steps={a.steps}", "eval.compare_versions=0"]
    cfg = load_config(ROOT / "configs/demo.yaml", base)
    sft_flow(cfg)  # the RL stage starts from NAME-sft@latest in the registry
    client, runs = MlflowClient(uri), {"none": [], "traces": []}
    default = cfg.lookback.traces_per_step
    for r in range(a.rounds):
        for name, budget in (("none", 0), ("traces", default)):
            run = load_config(ROOT / "configs/demo.yaml", [*base, f"run_dir={work}/rl-{name}-{r}",
                                                           f"lookback.traces_per_step={budget}"])
            result = rl_flow(run, force=True)
            mlflow.set_tracking_uri(uri)
            exp = client.get_run(result.run_id).info.experiment_id
            n = len(mlflow.search_traces(locations=[exp], run_id=result.run_id, return_type="list", max_results=5000))
            runs[name].append(step_time(client, result.run_id))
            print(f"round {r} {name:<6} step {runs[name][-1] * 1000:.1f} ms  traces {n}", flush=True)
    none, traced = (statistics.median(runs[k]) for k in ("none", "traces"))
    print(f"\n{a.rounds} rounds x {a.steps} steps of the demo's RL stage, {default} trajectories traced a step "
          f"(and every eval answer)")
    print(f"median step: none {none * 1000:.1f} ms, traces {traced * 1000:.1f} ms")
    print(f"ratio step_time traces/none: {traced / none:.3f}")


if __name__ == "__main__":
    main()
