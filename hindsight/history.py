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
        """One merged dict per step, sorted by step; a torn last line (a crash mid-write) is skipped."""
        if not self.path.exists():
            return []
        by_step: dict[int, dict] = {}
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            step = row.get("step")
            if isinstance(step, int) and (upto is None or step <= upto):
                by_step.setdefault(step, {}).update(row)
        return [by_step[s] for s in sorted(by_step)]

    def truncate_after(self, step: int) -> None:
        """Forget steps a resumed run will redo, so history never mixes two versions of a step."""
        rows = self.read(upto=step)
        if self.path.exists():
            atomic_write_bytes(self.path, "".join(json.dumps(r) + "\n" for r in rows).encode())


def _jsonable(v: float):
    """NaN and Inf are what the nonfinite_loss alert looks for: keep them, as strings JSON allows."""
    v = float(v)
    return v if math.isfinite(v) else str(v)


def as_float(v) -> float:
    return float(v) if isinstance(v, (int, float, str)) else math.nan
