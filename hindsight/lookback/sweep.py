"""A sweep's look-back: its ranking table and each trial's curves, from the trials' stored histories."""
from __future__ import annotations

from pathlib import Path

from hindsight.lookback.history import MetricsLog
from hindsight.state.rundir import RunDir
from hindsight.lookback.plots import curves
from hindsight.lookback.report import text_table
from hindsight.fsutil import atomic_write_bytes


def ranking_table(rows: list[dict], keys: list[str], metric: str) -> str:
    cols = ["rank", "trial", *keys, metric, "reward/mean", "version", "status"]
    table = text_table(cols, [[r.get(c) for c in cols] for r in rows], max_width=80)
    notes = [f"{r['trial']} {r['status']}: {r.get('why') or r.get('error')}" for r in rows
             if r.get("status") in ("stopped", "failed")]
    return "\n".join([table, *notes])


def sweep_plots(out_dir: Path, rows: list[dict]) -> list[Path]:
    """Each trial's reward curve and eval accuracy, one line per trial."""
    histories = {r["trial"]: MetricsLog(RunDir(r["run_dir"]).rl.metrics).read() for r in rows if r.get("run_dir")}
    series = {key: {t: [(h["step"], float(h[key])) for h in hist if key in h] for t, hist in histories.items()}
              for key in ("reward/mean", "eval/accuracy")}
    files = {"curves.png": curves(series["reward/mean"], "reward/mean", "reward per trial"),
             "accuracy.png": curves(series["eval/accuracy"], "eval/accuracy", "held-out accuracy per trial")}
    for name, data in files.items():
        atomic_write_bytes(out_dir / name, data)
    return [out_dir / n for n in files]
