"""A chaos soak (issue 47): a long tiny async run (k = 1) with faults injected at random moments
into its roles, then its ledger and final weights checked against an uninterrupted run.

    python bench/chaos.py [--faults 100] [--seed 0]      # about 15 minutes here

The faults, drawn at random every 1-3 s of the run:
- SIGKILL of the sampler process (a dead role);
- SIGSTOP of the sampler, SIGCONT a while later: shorter than `silent_after_s` it is a slow role
  and must be left alone; longer, a stopped one, which must be replaced;
- a reward that hangs in the sampler while its process lives (a hung role).

Prints `faults N, wedged W, lost groups L, trained twice T`, the replacements made,
`ratio max_step_time/(deadline + median_step)` (a step's wall time, rollout to update, against
the time a fault may take to be noticed plus a normal step), and the largest difference of the
final weights from the uninterrupted run's. Not here yet: a Ray node removed or added, a learner
rank, a short disk-full (see docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REWARD = '''
import os, time
from pathlib import Path


def flaky(completions, **_):
    """Varied within a group; hangs forever once whenever the chaos thread drops its marker (in
    the sampler only: the stage's own process scores what a dead sampler left unscored)."""
    marker = Path(os.environ["CHAOS_HANG"])
    if str(os.getpid()) != os.environ["CHAOS_STAGE_PID"] and marker.exists():
        marker.unlink()
        time.sleep(3600)
    return [float(len(c) % 3) for c in completions]
'''
WORKERS = {"heartbeat_s": 0.25, "silent_after_s": 3.0, "lease_ttl_s": 4.0, "lease_s_per_token": 0.0,
           "replacements": 100000, "stall_first_s": 600.0, "stall_min_s": 120.0}


def _config(work: Path, run_dir: Path, steps: int) -> dict:
    return {"name": "chaos", "seed": 5, "run_dir": str(run_dir),
            "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
            "rl": {"steps": steps, "prompts_per_step": 2, "samples_per_prompt": 4, "save_every": 1000,
                   "rollout": {"max_new_tokens": 4, "groups_per_batch": 1},
                   "learner": {"lr": 1e-2}, "scoring": {"rewards": [{"fn": "chaos_reward:flaky"}], "isolation": "inline"},
                   "async": {"max_staleness": 1}, "workers": WORKERS}}


def _train(cfg: dict, init: str, chaos=None):
    """Train every step in this process; returns (final weights, the run, seconds a step)."""
    from hindsight.config import PipelineConfig
    from hindsight.coordination.run import RLRun

    run = RLRun(PipelineConfig.model_validate(cfg), init, None)
    took, last = [], [time.monotonic()]
    threading.Thread(target=_wedge_alarm, args=(last, took), daemon=True).start()
    try:
        if chaos is not None:
            chaos.start(run)
        for step in range(run.rl.steps):
            t0 = time.monotonic()
            run.rollout(step), run.score(step), run.update(step)
            took.append(time.monotonic() - t0)
            last[0] = time.monotonic()
        if chaos is not None:
            chaos.stop()
        return {k: v.detach().clone() for k, v in run.policy.state_dict().items()}, run, took
    finally:
        run.close()


def _wedge_alarm(last: list[float], took: list[float], limit_s: float = 180.0) -> None:
    """A run with no step done for `limit_s` is wedged: say so and end the bench with an error."""
    while True:
        time.sleep(5.0)
        if time.monotonic() - last[0] > limit_s:
            print(f"wedged 1: no step done for {limit_s:g} s after step {len(took)}", flush=True)
            os._exit(1)


class Chaos:
    """Faults at random moments into the sampler the run holds now (it changes when replaced)."""

    def __init__(self, rng: random.Random, marker: Path, most: int):
        self.rng, self.marker, self.most = rng, marker, most
        self.counts: dict[str, int] = {}
        self._done = threading.Event()

    def start(self, run) -> None:
        self.run = run
        threading.Thread(target=self._loop, daemon=True).start()

    def stop(self) -> None:
        self._done.set()

    @property
    def injected(self) -> int:
        return sum(self.counts.values())

    def _loop(self) -> None:
        while not self._done.wait(self.rng.uniform(1.0, 3.0)) and self.injected < self.most:
            sampler = self.run.rollouts.sampler
            if sampler is None or sampler.proc.poll() is not None or not sampler.liveness.started:
                continue  # between a death and its replacement: nothing to hit
            kind = self.rng.choice(["kill", "pause", "stop", "hang"])
            pid = sampler.proc.pid
            try:
                if kind == "hang":
                    self.marker.touch()
                else:
                    os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            except ProcessLookupError:
                continue
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if kind in ("pause", "stop"):  # a pause is slow and left alone; a stop outlasts silent_after_s
                time.sleep(WORKERS["silent_after_s"] * (self.rng.uniform(0.1, 0.5) if kind == "pause" else 3))
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:  # replaced (killed) meanwhile
                    pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--steps", type=int, default=0, help="default: 4 steps a fault")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from hindsight.cpus import set_stage_threads
    from hindsight.data.demo import build_demo_data
    from hindsight.models.tiny import build_tiny_model

    set_stage_threads(None)
    steps = args.steps or 4 * args.faults
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_demo_data(work / "data", seed=0)
        init = str(build_tiny_model(work / "init", hidden=32, layers=1, heads=2))
        (work / "chaos_reward.py").write_text(REWARD)
        sys.path.insert(0, str(work))
        os.environ["CHAOS_HANG"], os.environ["CHAOS_STAGE_PID"] = str(work / "hang"), str(os.getpid())
        t0 = time.monotonic()
        clean, _, clean_took = _train(_config(work, work / "clean", steps), init)
        print(f"uninterrupted: {steps} steps in {time.monotonic() - t0:.0f} s", flush=True)
        chaos = Chaos(random.Random(args.seed), work / "hang", args.faults)
        t0 = time.monotonic()
        weights, run, took = _train(_config(work, work / "chaos", steps), init, chaos)
        print(f"with chaos: {steps} steps in {time.monotonic() - t0:.0f} s", flush=True)
        trained = [e.trained for s in range(steps) for e in run.ledger.read(s).values()]
        lost = steps * run.rl.prompts_per_step - sum(1 for n in trained if n >= 1)
        twice = sum(1 for n in trained if n > 1)
        events = [json.loads(x) for x in run.paths.workers_log.read_text().splitlines()] \
            if run.paths.workers_log.exists() else []
        why = {}
        for e in events:
            key = e["why"].split(" (")[0].split(":")[0][:40]
            why[key] = why.get(key, 0) + 1
        deadline = max(WORKERS["silent_after_s"], WORKERS["lease_ttl_s"])
        diff = max((weights[k] - clean[k]).abs().max().item() for k in clean)
        print(f"faults {chaos.injected} ({', '.join(f'{k} {n}' for k, n in sorted(chaos.counts.items()))}), "
              f"wedged 0, lost groups {lost}, trained twice {twice}")
        print(f"replacements {len(events)}: " + ", ".join(f"{k}: {n}" for k, n in sorted(why.items())))
        print(f"step time: median {statistics.median(took):.2f} s (uninterrupted {statistics.median(clean_took):.2f} s), "
              f"max {max(took):.1f} s")
        print(f"ratio max_step_time/(deadline + median_step): {max(took) / (deadline + statistics.median(took)):.2f}")
        print(f"final weights: largest |difference| from the uninterrupted run {diff:.3g}")


if __name__ == "__main__":
    main()
