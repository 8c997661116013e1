"""Does a long RL run stay flat? `hindsight run rl` on a tiny config for 2,000 steps (the real
command: Prefect, MLflow, the rollout store, the ledger, the history, the alerts, checkpoints
every 100 steps), with its per-step time and resident memory sampled from outside, early
(steps 100-300, or `--early A:B`) against late (the last 200, or `--late C:D`).

    python bench/long_run.py [--steps 2000]        # about 10 minutes here
    python bench/long_run.py --steps 600 --early 25:75 --late 525:575   # the soak of issue 36

Prints `ratio step_time late/early: X` (medians) and `ratio peak_memory late/early: Y` (the
largest RSS in each window), and the rollout store's bytes per step, from which docs/benchmarks.md
works out what a 10,000-step run of the example recipe takes on disk.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = """
name: long
seed: 0
model: {{base: tiny://demo}}
sft: {{enabled: false}}
reward_model: {{enabled: false}}
data: {{dir: {data}, dvc_file: null, build_demo: false, prompts: {data}/prompts.jsonl, eval: {data}/eval.jsonl}}
rl:
  init: {init}
  steps: {steps}
  prompts_per_step: 2
  samples_per_prompt: 2
  rollout: {{max_new_tokens: 3}}
  eval_every: {steps}
  save_every: 100
  report_every: {steps}
  keep_checkpoints: 2
eval: {{limit: 4, max_new_tokens: 3}}
retries: {{count: 0}}
"""


def _rss_mb(pid: int) -> float:
    """Resident memory of the process and its children (the reward worker), in MiB."""
    total = 0
    for p in [pid, *_children(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return out


def _store_bytes(rl: Path) -> int:
    return sum(p.stat().st_size for c in ("rollouts", "scores", "advantages") for p in (rl / c).glob("*.parquet"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--early", default="100:300", help="steps A:B of the early window")
    ap.add_argument("--late", default=None, help="steps C:D of the late window (default: the last 200)")
    a = ap.parse_args()
    from hindsight.data.demo import build_demo_data
    from hindsight.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_demo_data(work / "data", seed=0)
        init = build_tiny_model(work / "init", hidden=32, layers=1, heads=2)
        (work / "rl.yaml").write_text(CONFIG.format(data=work / "data", init=init, steps=a.steps))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        metrics = work / "runs/long/rl/metrics.jsonl"
        proc = subprocess.Popen([sys.executable, "-m", "cli", "run", "rl", "-c", "rl.yaml"], cwd=work, env=env,
                                stdout=subprocess.DEVNULL, stderr=open(work / "log", "w"))
        done_at, rss, seen, offset, n = {}, {}, 0, 0, 0
        while proc.poll() is None:
            try:  # only the bytes appended since the last look: reading the whole log would grow with it
                with metrics.open("rb") as fh:
                    fh.seek(offset)
                    new = fh.read()
                offset, n = offset + len(new), n + new.count(b"\n")
            except FileNotFoundError:
                pass
            if n > seen:
                now = time.monotonic()
                for step in range(seen + 1, n + 1):
                    done_at[step] = now
                rss[n] = _rss_mb(proc.pid)
                seen = n
            time.sleep(0.005)
        if proc.returncode != 0:
            raise SystemExit(f"the run failed: {(work / 'log').read_text()[-2000:]}")
        per_step = {s: done_at[s] - done_at[s - 1] for s in done_at if s - 1 in done_at}
        early = range(*map(int, a.early.split(":")))
        late = range(*map(int, a.late.split(":"))) if a.late else range(a.steps - 200, a.steps)
        t_early = statistics.median(per_step[s] for s in early if s in per_step)
        t_late = statistics.median(per_step[s] for s in late if s in per_step)
        m_early = max(v for s, v in rss.items() if s in early)
        m_late = max(v for s, v in rss.items() if s in late)
        per_step_bytes = _store_bytes(work / "runs/long/rl") / a.steps
    print(f"{a.steps} steps: step time median early ({early.start}-{early.stop}) {t_early * 1000:.1f} ms, late "
          f"({late.start}-{late.stop}) {t_late * 1000:.1f} ms; peak RSS early {m_early:.0f} MiB, late {m_late:.0f} MiB")
    print(f"ratio step_time late/early: {t_late / t_early:.3f}")
    print(f"ratio peak_memory late/early: {m_late / m_early:.3f}")
    print(f"rollout store: {per_step_bytes / 1024:.1f} KiB per step (4 completions of <= 3 tokens)")


if __name__ == "__main__":
    main()
