"""What a cached rerun of the demo costs, with one long-lived Prefect server against a server
started for the command (what every command paid before `hindsight server`), side by side.

    python bench/cached_rerun.py [--repeats 3]

In a fresh clone of this repository (its own PREFECT_HOME and MLflow store): one full
`hindsight run pipeline -c configs/demo.yaml`, then `--repeats` cached reruns against the shared
server, and `--repeats` times the start-up of a fresh Prefect server (what a command without a
running server waits for before its first flow). Prints medians and the ratio.

For each cached rerun it also prints the time from the command's start to its first stage (the
`sft` subflow run's start in Prefect) and, as the floor no change of ours can go under, how long
`import prefect, mlflow` and MLflow's SQL store take in a fresh interpreter on this machine.
Bytecode caching is left on for the commands (this machine's environment sets
PYTHONDONTWRITEBYTECODE, which a user's install does not: every command would compile our
sources anew).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _first_stage_s(env: dict, started: dt.datetime) -> float:
    """Seconds from `started` to the newest `sft` subflow run's start, read from the Prefect server."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = json.loads((Path(env["PREFECT_HOME"]) / "hindsight-server.json").read_text())["url"]
    with temporary_settings({PREFECT_API_URL: url}), get_client(sync_client=True) as client:
        run = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["sft"])),
                                    sort=FlowRunSort.START_TIME_DESC, limit=1)[0]
    return (run.start_time - started).total_seconds()


def _import_floor(env: dict) -> float:
    code = "import prefect, mlflow, mlflow.store.tracking.sqlalchemy_store"
    return _timed([sys.executable, "-c", code], Path("/"), env)


def _timed(cmd: list[str], cwd: Path, env: dict) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="hindsight-bench-") as tmp:
        work = Path(tmp) / "repo"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(work)], check=True)
        env = {**os.environ, "PREFECT_HOME": str(Path(tmp) / "prefect"), "PYTHONPATH": str(work),
               "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"}
        env.pop("PREFECT_API_URL", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        cli = [sys.executable, "-m", "cli"]
        try:
            startup = _timed(cli + ["server", "start"], work, env)
            full = _timed(cli + ["run", "pipeline", "-c", "configs/demo.yaml"], work, env)
            cached, first, floor = [], [], []
            for _ in range(args.repeats):
                started = dt.datetime.now(dt.timezone.utc)
                cached.append(_timed(cli + ["run", "pipeline", "-c", "configs/demo.yaml"], work, env))
                first.append(_first_stage_s(env, started))
                floor.append(_import_floor(env))
            starts = [startup]
            for _ in range(args.repeats - 1):
                _timed(cli + ["server", "stop"], work, env)
                starts.append(_timed(cli + ["server", "start"], work, env))
        finally:
            subprocess.run(cli + ["server", "stop"], cwd=work, env=env, capture_output=True)
    c, s = statistics.median(cached), statistics.median(starts)
    print(f"full demo pipeline:                     {full:6.1f} s")
    print(f"cached rerun, shared server (median):   {c:6.1f} s   runs {', '.join(f'{x:.1f}' for x in cached)}")
    print(f"Prefect server start-up (median):       {s:6.1f} s   runs {', '.join(f'{x:.1f}' for x in starts)}")
    print(f"start to the first stage (median):      {statistics.median(first):6.1f} s   runs "
          f"{', '.join(f'{x:.1f}' for x in first)}")
    print(f"import prefect + mlflow alone (median): {statistics.median(floor):6.1f} s   runs "
          f"{', '.join(f'{x:.1f}' for x in floor)}")
    print(f"cached rerun with a server per command: {c + s:6.1f} s   (rerun + start-up)")
    print(f"ratio per-command / shared:             {(c + s) / c:6.2f}x   target: cached rerun under 5 s "
          f"({'met' if c < 5 else 'NOT met'})")


if __name__ == "__main__":
    main()
