"""The rollout store: one Parquet shard per RL step for each component, plus a manifest.

Components are written separately because they are produced by separate stages:
`rollouts` by the actor (tokens and behaviour log-probs) and `scores` by the scorer
(per-function rewards, the total, and reference log-probs), `advantages` by the learner
(what each trained completion was pushed by, for reports). A shard is complete once its
final name exists: it is written under a temporary name and renamed.

Integrity: every file carries Parquet's page CRCs, checked on every read, and each step's
shard has a `.sha256` sidecar, written before the shard itself (so a shard never exists
without one). `check` verifies a shard against it; a corrupt shard is moved under
`corrupt/` (kept, never deleted) and the caller generates it again from its seed.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from hindsight.errors import StorageError
from hindsight.fsutil import atomic_write_bytes, remove_dead_temporaries
from hindsight.state.rundir import step_file

log = logging.getLogger("hindsight.state.store")

COMPONENTS = ("rollouts", "scores", "advantages")
_SHARD = re.compile(r"^step-(\d{6})\.parquet$")

_BATCH = re.compile(r"^batch-(\d{5})-(\d{5})\.parquet$")
_CACHED_FILES = 8  # a step's parts and shards: what its next phase reads back (rows as lists cost memory)


class CorruptShard(StorageError):
    """A stored file fails its checksum or cannot be decoded."""


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


class RolloutStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self._cache: dict[Path, list[dict]] = {}  # rows of files this process wrote, newest last

    def path(self, component: str, step: int) -> Path:
        assert component in COMPONENTS, component
        return self.root / component / f"{step_file(step)}.parquet"

    def has(self, component: str, step: int) -> bool:
        return self.path(component, step).exists()

    def steps(self, component: str) -> list[int]:
        folder = self.root / component
        if not folder.exists():
            return []
        found = (_SHARD.match(p.name) for p in folder.iterdir())
        return sorted(int(m.group(1)) - 1 for m in found if m)

    def write(self, component: str, step: int, rows: list[dict]) -> Path:
        return self._write(self.path(component, step), rows, checksum=True)

    def check(self, component: str, step: int) -> bool:
        """True when the step's shard is stored and intact. A corrupt one is moved aside (and
        False returned), so the caller generates it again."""
        path = self.path(component, step)
        if not path.exists():
            return False
        if path in self._cache:
            return True  # this process wrote it
        try:
            self._remember(path, self._read(path))
            return True
        except CorruptShard as exc:
            self.set_aside(component, step, str(exc))
            return False

    def set_aside(self, component: str, step: int, why: str = "") -> Path | None:
        """Move a step's shard (and its sidecar) under `corrupt/`, timestamped: kept, not deleted."""
        path = self.path(component, step)
        if not path.exists():
            return None
        target = self.root / "corrupt" / component / f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}"
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, target)
        if _sidecar(path).exists():
            os.replace(_sidecar(path), target.with_name(target.name + ".sha256"))
        self._cache.pop(path, None)
        if why:
            log.warning("%s; moved to %s, it is generated again from its seed", why, target)
        return target

    def read(self, component: str, step: int) -> list[dict]:
        return self._read(self.path(component, step))

    def column(self, component: str, step: int, name: str) -> list:
        """One column of a step's shard, without decoding the rest (token lists are the bulk)."""
        path = self.path(component, step)
        if path in self._cache:
            return [r[name] for r in self._cache[path]]
        return self._table(path, columns=[name]).column(name).to_pylist()

    # --- parts: what a worker wrote for a group or a batch of groups, before the step's shard --
    def part_path(self, component: str, step: int, group: int) -> Path:
        return self._part_dir(component, step) / f"group-{group:05d}.parquet"

    def _part_dir(self, component: str, step: int) -> Path:
        return self.root / "parts" / component / step_file(step)

    def _part_files(self, component: str, step: int) -> tuple[set[str], dict[Path, tuple[int, int]]]:
        """One listing of the step's part folder: every file name, and the batch parts
        (`batch-FIRST-LAST.parquet`: groups FIRST..LAST, written at once) with their spans."""
        folder = self._part_dir(component, step)
        try:
            names = {p.name for p in folder.iterdir()}
        except FileNotFoundError:  # no part yet, or the step's shard was just merged
            names = set()
        batches = {folder / m.group(0): (int(m.group(1)), int(m.group(2))) for m in map(_BATCH.match, names) if m}
        return names, batches

    def _batch_parts(self, component: str, step: int) -> dict[Path, tuple[int, int]]:
        return self._part_files(component, step)[1]

    def _files_of(self, component: str, step: int, groups: list[int]) -> dict[int, Path | None]:
        """The part file holding each group, from one listing of the step's part folder."""
        names, batches = self._part_files(component, step)
        folder = self._part_dir(component, step)
        out: dict[int, Path | None] = {}
        for g in groups:
            single = f"group-{g:05d}.parquet"
            if single in names:
                out[g] = folder / single
            else:
                out[g] = next((path for path, (a, b) in batches.items() if a <= g <= b), None)
        return out

    def _file_of(self, component: str, step: int, group: int) -> Path | None:
        return self._files_of(component, step, [group])[group]

    def write_part(self, component: str, step: int, group: int, rows: list[dict]) -> Path:
        return self._write(self.part_path(component, step, group), rows)

    def write_batch_part(self, component: str, step: int, groups: list[int], rows: list[dict]) -> Path:
        """Consecutive groups sampled (or scored) together, in one file: one write instead of one per group."""
        assert groups == list(range(groups[0], groups[-1] + 1)), groups
        name = f"batch-{groups[0]:05d}-{groups[-1]:05d}.parquet"
        return self._write(self._part_dir(component, step) / name, rows)

    def read_part(self, component: str, step: int, group: int) -> list[dict]:
        path = self._file_of(component, step, group)
        if path is None:
            raise FileNotFoundError(self.part_path(component, step, group))
        return [r for r in self._read(path) if r["group"] == group]

    def groups_rows(self, component: str, step: int, groups: list[int]) -> dict[int, list[dict]]:
        """Several groups' rows, each file read once: the parts that hold them, else the step's shard."""
        files = self._files_of(component, step, groups)
        rows = [r for path in dict.fromkeys(p for p in files.values() if p) for r in self._read(path)]
        if None in files.values():
            rows += self.read(component, step)
        out = {g: [] for g in groups}
        for r in rows:
            if r["group"] in out:
                out[r["group"]].append(r)
        return out

    def has_part(self, component: str, step: int, group: int) -> bool:
        return self._file_of(component, step, group) is not None

    def with_parts(self, component: str, step: int, groups: list[int]) -> set[int]:
        """Those of `groups` that have a part (one folder listing for all of them)."""
        return {g for g, path in self._files_of(component, step, groups).items() if path is not None}

    def drop_parts(self, component: str, step: int) -> None:
        """Delete the step's part files (scores from a reward that failed on them must not be trained on)."""
        import shutil

        shutil.rmtree(self._part_dir(component, step), ignore_errors=True)

    def merge_parts(self, component: str, step: int, groups: list[int]) -> Path:
        """The step's shard from its groups' parts, in group order; the parts are removed after.
        One batch part that holds exactly the step's groups becomes the shard by a rename."""
        folder, path = self._part_dir(component, step), self.path(component, step)
        batches = self._batch_parts(component, step)
        whole = [p for p, (a, b) in batches.items() if list(range(a, b + 1)) == groups]
        if whole and len(list(folder.iterdir())) == 1:
            path.parent.mkdir(parents=True, exist_ok=True)
            data = whole[0].read_bytes()
            if whole[0] not in self._cache:  # another process's part is checked before it becomes the shard
                self._table_from(whole[0], data)
            atomic_write_bytes(_sidecar(path), hashlib.sha256(data).hexdigest().encode())
            os.replace(whole[0], path)  # already fsynced when it was written
            if whole[0] in self._cache:
                self._remember(path, self._cache.pop(whole[0]))
        else:
            by_group = self.groups_rows(component, step, groups)
            self.write(component, step, [r for g in groups for r in by_group[g]])
        for p in folder.glob("*.parquet"):
            p.unlink()
            self._cache.pop(p, None)
        remove_dead_temporaries(folder)  # a part's writer killed mid-write (the rerun resampled its groups)
        folder.rmdir()
        return path

    # --- files, with what this process wrote kept in memory for its next read ---------------
    def _write(self, path: Path, rows: list[dict], checksum: bool = False) -> Path:
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buf, compression="zstd", write_page_checksum=True)
        data = buf.getvalue()
        if checksum:  # the sidecar first: a crash between the two leaves no unverifiable shard
            atomic_write_bytes(_sidecar(path), hashlib.sha256(data).hexdigest().encode())
        atomic_write_bytes(path, data)
        self._remember(path, rows)
        return path

    def _read(self, path: Path) -> list[dict]:
        cached = self._cache.get(path)
        return [dict(r) for r in cached] if cached is not None else self._table(path).to_pylist()

    def _table(self, path: Path, columns: list[str] | None = None) -> pa.Table:
        return self._table_from(path, path.read_bytes(), columns)

    @staticmethod
    def _table_from(path: Path, data: bytes, columns: list[str] | None = None) -> pa.Table:
        """Decode a file's bytes, after its sidecar's sha256 if it has one; page CRCs always."""
        sidecar = _sidecar(path)
        if sidecar.exists():
            want, got = sidecar.read_text().strip(), hashlib.sha256(data).hexdigest()
            if want != got:
                raise CorruptShard(f"{path}: sha256 {got[:12]}… does not match the {want[:12]}… recorded when it "
                                   f"was written (corrupt)")
        try:
            return pq.read_table(pa.BufferReader(data), columns=columns, page_checksum_verification=True)
        except (OSError, pa.ArrowException) as exc:
            raise CorruptShard(f"{path}: corrupt or truncated Parquet ({str(exc).splitlines()[0][:200]})") from None

    def _remember(self, path: Path, rows: list[dict]) -> None:
        """Keep the newest few files' rows: the next phase of the same step reads them back."""
        self._cache[path] = rows
        while len(self._cache) > _CACHED_FILES:
            self._cache.pop(next(iter(self._cache)))
