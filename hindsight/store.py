"""The rollout store: one Parquet shard per RL step for each component, plus a manifest.

Components are written separately because they are produced by separate stages:
`rollouts` by the actor (tokens and behaviour log-probs) and `scores` by the scorer
(per-function rewards, the total, and reference log-probs), `advantages` by the learner
(what each trained completion was pushed by, for reports). A shard is complete once its
final name exists: it is written under a temporary name and renamed.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hindsight.fsutil import atomic_write_bytes

COMPONENTS = ("rollouts", "scores", "advantages")
_SHARD = re.compile(r"^step-(\d{6})\.parquet$")


class RolloutStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, component: str, step: int) -> Path:
        assert component in COMPONENTS, component
        return self.root / component / f"step-{step:06d}.parquet"

    def has(self, component: str, step: int) -> bool:
        return self.path(component, step).exists()

    def steps(self, component: str) -> list[int]:
        folder = self.root / component
        if not folder.exists():
            return []
        found = (_SHARD.match(p.name) for p in folder.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def write(self, component: str, step: int, rows: list[dict]) -> Path:
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buf, compression="zstd")
        path = self.path(component, step)
        atomic_write_bytes(path, buf.getvalue())
        return path

    def read(self, component: str, step: int) -> list[dict]:
        return pq.read_table(self.path(component, step)).to_pylist()

    # --- parts: what one worker wrote for one group, before the step's shard exists -------
    def part_path(self, component: str, step: int, group: int) -> Path:
        return self.root / "parts" / component / f"step-{step:06d}" / f"group-{group:05d}.parquet"

    def write_part(self, component: str, step: int, group: int, rows: list[dict]) -> Path:
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buf, compression="zstd")
        path = self.part_path(component, step, group)
        atomic_write_bytes(path, buf.getvalue())
        return path

    def read_part(self, component: str, step: int, group: int) -> list[dict]:
        return pq.read_table(self.part_path(component, step, group)).to_pylist()

    def group_rows(self, component: str, step: int, group: int) -> list[dict]:
        """One group's rows: from its part while the step's shard is being built, else from the shard."""
        if self.has_part(component, step, group):
            return self.read_part(component, step, group)
        return [r for r in self.read(component, step) if r["group"] == group]

    def groups_rows(self, component: str, step: int, groups: list[int]) -> dict[int, list[dict]]:
        """Several groups' rows: each from its part, or from the step's shard, read once."""
        out = {g: self.read_part(component, step, g) for g in groups if self.has_part(component, step, g)}
        rest = [g for g in groups if g not in out]
        if rest:
            shard = self.read(component, step)
            for g in rest:
                out[g] = [r for r in shard if r["group"] == g]
        return out

    def has_part(self, component: str, step: int, group: int) -> bool:
        return self.part_path(component, step, group).exists()

    def merge_parts(self, component: str, step: int, groups: list[int]) -> Path:
        """The step's shard from its groups' parts, in group order; the parts are removed after."""
        rows = [row for g in groups for row in pq.read_table(self.part_path(component, step, g)).to_pylist()]
        path = self.write(component, step, rows)
        folder = self.part_path(component, step, 0).parent
        for p in folder.glob("*.parquet"):
            p.unlink()
        folder.rmdir()
        return path
