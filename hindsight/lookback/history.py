"""The RL run's metric history on disk (`rl/metrics.jsonl`), beside its rollouts.

It is what alerts compare against after a resume, what a regenerated report summarises, and
what the plots draw, without asking MLflow. Lines are appended; a step written twice (a
resumed run repeats the steps after its checkpoint) keeps its newest values.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from hindsight.fsutil import append_line, atomic_write_bytes


class MetricsLog:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def append(self, step: int, metrics: dict) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items() if isinstance(v, (int, float))}}
        append_line(self.path, json.dumps(row))

    def read(self, upto: int | None = None) -> list[dict]:
        """One merged dict per step, sorted by step."""
        by_step: dict[int, dict] = {}
        for row in read_rows(self.path, upto):
            by_step.setdefault(row["step"], {}).update(row)
        return [by_step[s] for s in sorted(by_step)]

    def truncate_after(self, step: int) -> None:
        """Forget steps a resumed run will redo, so history never mixes two versions of a step."""
        truncate_rows_after(self.path, step)


def read_rows(path: Path, upto: int | None = None) -> list[dict]:
    """Every row of a step log (metrics, alerts) in order; a torn last line (a crash mid-write) is skipped."""
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row.get("step"), int) and (upto is None or row["step"] <= upto):
            rows.append(row)
    return rows


def truncate_rows_after(path: Path, step: int) -> None:
    if Path(path).exists():
        atomic_write_bytes(Path(path), "".join(json.dumps(r) + "\n" for r in read_rows(path, step)).encode())


def _jsonable(v: float):
    """NaN and Inf are what the nonfinite_loss alert looks for: keep them, as strings JSON allows."""
    v = float(v)
    return v if math.isfinite(v) else str(v)


def as_float(v) -> float:
    return float(v) if isinstance(v, (int, float, str)) else math.nan
