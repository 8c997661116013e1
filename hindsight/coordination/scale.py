"""`hindsight scale`: a request a running RL stage reads at its next step boundary
(`rl/scale.json`), and the answer it writes (`rl/scale-result.json`: applied, or refused with
what it needs against what is free). The Ray rollout pool applies it (`placement`)."""
from __future__ import annotations

import time
import uuid
from pathlib import Path

from hindsight.errors import ConfigError
from hindsight.fsutil import atomic_write_json, read_json
from hindsight.state.rundir import RLDir


def request_scale(run_dir: str | Path, rollout: int) -> Path:
    """`hindsight scale`: ask a running RL stage for `rollout` workers from its next step on."""
    paths = RLDir.find(run_dir)
    if not paths.config.exists():
        raise ConfigError(f"{run_dir}: not an RL run directory (no rl/config.json)")
    if rollout < 1:
        raise ConfigError(f"--rollout {rollout}: a run needs at least 1 rollout worker")
    atomic_write_json(paths.scale_request, {"rollout": rollout, "id": uuid.uuid4().hex})  # each request answered once
    return paths.scale_request


def scale_outcome(request: Path, wait_s: float) -> str | None:
    """What the run made of the request: a line when it was applied, a `ConfigError` when it was
    refused (the resources it needs against what is free), None when not handled within `wait_s`."""
    wanted, deadline = read_json(request), time.monotonic() + wait_s
    while True:
        result = read_json(RLDir(request.parent).scale_result, default=None) or {}
        if result.get("request") == wanted:
            if "refused" in result:
                raise ConfigError(f"hindsight scale: refused at step {result['step']}: {result['refused']}")
            return f"rollout workers scaled from {result['scaled'][0]} to {result['scaled'][1]} at step {result['step']}"
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)
