"""Resuming an RL run: check the stored fingerprint, re-score after a scoring change, move
old state aside on request, and recompute what a resume must honour (the alerts' lr cuts)."""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from hindsight.errors import CheckpointError
from hindsight.state.fingerprint import Changes, check_resume, compare
from hindsight.fsutil import append_line, atomic_write_json, read_json
from hindsight.lookback.history import read_rows
from hindsight.state.rundir import RLDir, step_of

log = logging.getLogger("hindsight.coordination.resume")


def prepare_resume(paths: RLDir, fingerprint: dict, start: int, steps: int) -> Changes:
    """Compare the config's fingerprint with the stored one, before anything is loaded or sampled.
    Refuses sampling and algorithm changes; a scoring change moves the score shards of the steps
    still to train aside (they are scored again); a training change is logged. Then the config's
    fingerprint is what is stored: it is on disk before the run's first shard."""
    _refuse_old_numbering(paths)
    stored = read_json(paths.fingerprint, default=None)
    if stored and start == 0 and not _holds_samples(paths):
        stored = None  # an attempt that failed before its first sample: nothing to resume, nothing changed
    changes = compare(stored, fingerprint) if stored else Changes()
    check_resume(changes, paths.path, start, steps)
    if changes.keys("scoring"):
        moved = _set_scores_aside(paths, start)
        log.warning("rl: scoring settings changed (%s): %d stored score shard(s) from step %d on moved to %s and "
                    "scored again", changes.describe("scoring"), moved, start, paths.rescored)
    if changes.by_section:
        append_line(paths.resume_changes, json.dumps(
            {"step": start, "time": time.time(), "changes": {s: {k: list(v) for k, v in d.items()}
                                                             for s, d in changes.by_section.items()}}, default=str))
    if changes.by_section or stored is None:
        atomic_write_json(paths.fingerprint, fingerprint)
    return changes


def _refuse_old_numbering(paths: RLDir) -> None:
    """Step files are numbered from 1 (`rundir.step_file`); a folder written when they were
    numbered from 0 has a `step-000000` file, and read now its shards would train on the wrong step."""
    old = [f for f in (paths / "rollouts" / "step-000000.parquet", paths.scores / "step-000000.parquet",
                       paths.ledger / "step-000000.json") if f.exists()]
    if old:
        raise CheckpointError(f"{paths.path}: written by an older hindsight that numbered step files from 0 ({old[0]}); "
                              f"it cannot be resumed: rerun with --force to retrain it, or use another run_dir")


def _holds_samples(paths: RLDir) -> bool:
    """Whether the folder holds anything a changed fingerprint would make stale: a stored rollout
    or score (shards or parts) or a checkpoint."""
    folders = (paths / "rollouts", paths.scores, paths / "parts", paths.checkpoints)
    return any(f.is_dir() and any(f.iterdir()) for f in folders)


def _set_scores_aside(paths: RLDir, start: int) -> int:
    """Score shards and parts of steps >= start go under rl/rescored/<time>/ (kept, never deleted)."""
    target = paths.rescored / time.strftime("%Y%m%d-%H%M%S")
    moved = 0
    for shard in sorted(paths.scores.glob("step-*.parquet")):
        if step_of(shard.name) >= start:
            (target / "scores").mkdir(parents=True, exist_ok=True)
            os.replace(shard, target / "scores" / shard.name)
            moved += 1
    parts = paths.score_parts
    if parts.exists():
        target.mkdir(parents=True, exist_ok=True)
        os.replace(parts, target / "parts")
    return moved


def lr_multiplier(alerts_file: Path, up_to_step: int) -> float:
    """The product of the `lower_lr` factors fired up to a step, from the alert log: each factor
    stays its own record, so a resume can apply a new rl.learner.lr and still honour them."""
    out = 1.0
    for alert in read_rows(alerts_file, up_to_step):
        if alert.get("action") == "lower_lr":
            out *= alert.get("factor", 1.0)
    return out
