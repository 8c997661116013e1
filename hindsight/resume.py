"""Resuming an RL run: refuse state stored under other settings, move it aside on request,
and recompute what a resume must honour (the alerts' learning-rate cuts)."""
from __future__ import annotations

import time
from pathlib import Path

from hindsight.errors import CheckpointError
from hindsight.history import read_rows


def check_compatible(manifest: dict, fingerprint: dict, run_dir: Path) -> None:
    """Refuse to resume state produced under settings that change what was stored."""
    stored = manifest.get("fingerprint")
    if not stored:
        return
    # keys added by a later hindsight version are absent from older state: those ran with the default
    diff = sorted(k for k in stored if stored.get(k) != fingerprint.get(k))
    if diff:
        detail = ", ".join(f"{k}: stored {stored.get(k)!r}, config {fingerprint.get(k)!r}" for k in diff)
        raise CheckpointError(f"{run_dir}: cannot resume, the stored state is incompatible ({detail}); "
                              f"rerun with --force-new-run to move it aside and start over")


def archive_run_dir(run_dir: Path) -> Path | None:
    """--force-new-run: move old state aside (never delete it) so the run starts fresh."""
    if not run_dir.exists():
        return None
    target = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(target)
    return target


def lr_multiplier(alerts_file: Path, up_to_step: int) -> float:
    """The product of the `lower_lr` factors fired up to a step, from the alert log: each factor
    stays its own record, so a resume can apply a new rl.lr and still honour them."""
    out = 1.0
    for alert in read_rows(alerts_file, up_to_step):
        if alert.get("action") == "lower_lr":
            out *= alert.get("factor", 1.0)
    return out
