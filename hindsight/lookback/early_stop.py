"""A sweep's early stop: a trial whose fitted asymptote cannot reach the leader's stops.

Each trial posts its newest fit (`lookback.curve`) to the sweep's board, a folder of one JSON
file per trial, and reads the others'. The rule (off unless the sweep enables it): after
`min_steps` steps, a trial whose asymptote's upper bound is below the best lower bound among
the other trials (running or finished) stops. Both are 95% intervals, so a trial stops only
when the data say it is very unlikely to win, and a finished leader keeps its last fit.
"""
from __future__ import annotations

import json
from pathlib import Path

from hindsight.fsutil import atomic_write_json

PREFIX = {"reward/mean": "reward/curve", "eval/accuracy": "eval/curve"}


def post(board: Path, trial: str, step: int, metrics: dict, metric: str) -> dict | None:
    """Write this trial's newest fit of `metric` to the board; the fit, or None before there is one."""
    p = PREFIX[metric]
    if f"{p}/asymptote" not in metrics:
        return None
    fit = {"trial": trial, "step": step, "asymptote": metrics[f"{p}/asymptote"],
           "lo": metrics[f"{p}/asymptote_lo"], "hi": metrics[f"{p}/asymptote_hi"]}
    atomic_write_json(board / f"{trial}.json", fit)
    return fit


def leader(board: Path, trial: str) -> dict | None:
    """The other trial with the highest lower bound; a file being written or torn is skipped."""
    best = None
    for path in sorted(board.glob("*.json")):
        if path.stem == trial:
            continue
        try:
            fit = json.loads(path.read_text())
            lo = float(fit["lo"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if best is None or lo > best["lo"]:
            best = {**fit, "lo": lo}
    return best


def verdict(mine: dict | None, lead: dict | None, step: int, min_steps: int, metric: str) -> str | None:
    """Why this trial stops, or None to go on."""
    if mine is None or lead is None or step < min_steps or not mine["hi"] < lead["lo"]:
        return None
    return (f"early stop at step {step}: the fitted {metric} asymptote {mine['asymptote']:.3f} (95% up to "
            f"{mine['hi']:.3f}) cannot reach trial {lead['trial']}'s (at least {lead['lo']:.3f}, fitted at its step "
            f"{lead['step']})")
