"""A chaos soak (issue 47): a long tiny async run (k = 1) with faults injected at random moments
into its roles, then its ledger and final weights checked against an uninterrupted run.

    python bench/chaos.py [--faults 100] [--seed 0]      # about 15 minutes here

The faults, one at a time, 1-3 s apart, each after the run has recovered from the one before:
- SIGKILL of the sampler process (a dead role);
- SIGSTOP of the sampler, SIGCONT a while later: shorter than `silent_after_s` ("pause") it is a
  slow role and must be left alone; longer ("stop"), a stopped one, which must be replaced;
- a reward that hangs in the sampler while its process lives (a hung role).
The chaos run goes on until the last fault is recovered from; the uninterrupted run then trains
as many steps.

Prints `faults N, wedged W, lost groups L, trained twice T` (a run with no step for 180 s prints
`wedged 1` and exits 1), the replacements made by reason, each kind's recovery time (injection to
the end of the second step after its replacement: with k = 1 the first may have been sampled
before), a replacement's start-up, `ratio max_recovery/(deadline + poll + report + start + 3
steps)` (at most 1 when no fault took longer to recover from than the longest a fault may take
to be noticed and reported, a replacement's start-up and the steps redone), and the largest
difference of the final weights from the uninterrupted run's. Not here: a Ray node removed or
added (tests/faults/test_ray_nodes.py), a learner rank, a disk-full.
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
    # thousands of steps of a tiny model: its gradient norm spikes now and then (50x its median
    # at step 8842 of one soak), which the divergence check rightly stops; that check has its own
    # tests, and here both runs train the same steps without it
    return {"name": "chaos", "seed": 5, "run_dir": str(run_dir),
            "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
            "rl": {"steps": steps, "prompts_per_step": 2, "samples_per_prompt": 4, "save_every": 1000,
                   "rollout": {"max_new_tokens": 4, "groups_per_batch": 1},
                   "learner": {"lr": 1e-3, "health": {"enabled": False}},
                   "scoring": {"rewards": [{"fn": "chaos_reward:flaky"}], "isolation": "inline"},
                   "async": {"max_staleness": 1}, "workers": WORKERS}}


def _train(cfg: dict, init: str, chaos=None, steps: int | None = None):
    """Train in this process until `steps` steps, or with chaos until its last fault is recovered
    from (then a few steps more); returns (final weights, the run, seconds a step)."""
    from hindsight.config import PipelineConfig
    from hindsight.coordination.run import RLRun

    run = RLRun(PipelineConfig.model_validate(cfg), init, None)
    took, last, ended = [], [time.monotonic()], threading.Event()
    threading.Thread(target=_wedge_alarm, args=(last, took, ended), daemon=True).start()
    try:
        if chaos is not None:
            chaos.start(run, took)
        for step in range(run.rl.steps):
            if step == steps or (chaos is not None and chaos.finished.is_set() and step >= chaos.last_step + 3):
                break
            if chaos is not None:
                chaos.boundary()
            t0 = time.monotonic()
            run.rollout(step), run.score(step), run.update(step)
            took.append(time.monotonic() - t0)
            last[0] = time.monotonic()
        if chaos is not None:
            chaos.stop()
        return {k: v.detach().clone() for k, v in run.policy.state_dict().items()}, run, took
    finally:
        ended.set()  # this run's alarm ends with it (the next run in this process has its own)
        run.close()


def _wedge_alarm(last: list[float], took: list[float], ended: threading.Event, limit_s: float = 180.0) -> None:
    """A run with no step done for `limit_s` is wedged: say so and end the bench with an error."""
    while not ended.wait(5.0):
        if time.monotonic() - last[0] > limit_s:
            print(f"wedged 1: no step done for {limit_s:g} s after step {len(took)}", flush=True)
            os._exit(1)


def _resume(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:  # replaced (killed) meanwhile
        pass


class Faults:
    """What every soak's fault thread shares: its counts and recovery times, a thread started
    with the run (`_loop`, the soak's own), and the events that end it."""

    def __init__(self, rng: random.Random, marker: Path, most: int):
        self.rng, self.marker, self.most = rng, marker, most
        self.counts: dict[str, int] = {}
        self.recovery: dict[str, list[float]] = {}
        self.finished, self._done = threading.Event(), threading.Event()
        self.last_step = 0

    def start(self, run, took: list[float]) -> None:
        self.run, self.took = run, took
        threading.Thread(target=self._loop, daemon=True).start()

    def stop(self) -> None:
        self._done.set()

    @property
    def injected(self) -> int:
        return sum(self.counts.values())

    def _loop(self) -> None:
        raise NotImplementedError

    def boundary(self) -> None:
        """Called by the training loop between steps, in the main thread (for what must run there)."""


class Chaos(Faults):
    """Faults, one at a time, into the sampler the run holds now (it changes when replaced): each
    is injected, then the next waits until a step has completed after it. A fault's recovery is
    the time from its injection to that step's end; a replacement's start is the time from a new
    sampler's appearance to its first heartbeat."""

    def __init__(self, rng: random.Random, marker: Path, most: int):
        super().__init__(rng, marker, most)
        self.replacements: list = []  # the samplers that replaced one hit

    def _loop(self) -> None:
        while self.injected < self.most and not self._done.wait(self.rng.uniform(1.0, 3.0)):
            sampler = self.run.pool.sampler
            if sampler is None or sampler.proc.poll() is not None or not sampler.liveness.started:
                continue  # between a death and its replacement: nothing to hit
            kind = self.rng.choice(["kill", "pause", "stop", "hang"])
            t0, pid = time.monotonic(), sampler.proc.pid
            try:
                if kind == "hang":
                    self.marker.touch()
                else:
                    os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            except ProcessLookupError:
                continue
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if kind in ("pause", "stop"):  # a pause is slow and left alone; a stop outlasts silent_after_s
                held = WORKERS["silent_after_s"] * (self.rng.uniform(0.1, 0.5) if kind == "pause" else 3)
                timer = threading.Timer(held, _resume, args=(pid,))
                timer.start()
            self._recovered(kind, t0, sampler)
            if kind in ("pause", "stop"):
                timer.join()  # one fault at a time: a stopped process is not hit again
            if os.environ.get("CHAOS_VERBOSE"):
                print(f"{time.time():.2f} {kind} pid {pid} step {len(self.took)} "
                      f"recovered in {self.recovery[kind][-1]:.2f} s", flush=True)
        self.last_step = len(self.took)
        self.finished.set()

    def _recovered(self, kind: str, t0: float, hit) -> None:
        """Wait for the hit sampler's replacement (a pause is left alone), then for two steps to
        end (with k = 1 the first may have been sampled before); note the recovery."""
        while kind != "pause" and self.run.pool.sampler is hit and not self._done.is_set():
            time.sleep(0.02)
        done = len(self.took)
        while len(self.took) < done + 2 and not self._done.is_set():
            time.sleep(0.02)
        self.recovery.setdefault(kind, []).append(time.monotonic() - t0)
        now = self.run.pool.sampler
        if now is not hit and now is not None:
            self.replacements.append(now)

    @property
    def starts(self) -> list[float]:
        """Each replacement's start-up: created to its first group written (a heartbeat says so,
        so to within heartbeat_s)."""
        return [s.liveness.served_at - s.liveness.created_at for s in self.replacements if s.liveness.served_at]


def workspace(work: Path) -> str:
    """This process's threads, the demo data, a tiny model (its folder returned) and the soak's
    reward module, importable, under `work`."""
    from hindsight.cpus import set_stage_threads
    from hindsight.data.demo import build_demo_data
    from hindsight.models.tiny import build_tiny_model

    set_stage_threads(None)
    build_demo_data(work / "data", seed=0)
    init = str(build_tiny_model(work / "init", hidden=32, layers=1, heads=2))
    (work / "chaos_reward.py").write_text(REWARD)
    sys.path.insert(0, str(work))
    return init


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        init = workspace(work)
        os.environ["CHAOS_HANG"], os.environ["CHAOS_STAGE_PID"] = str(work / "hang"), str(os.getpid())
        chaos = Chaos(random.Random(args.seed), work / "hang", args.faults)
        t0 = time.monotonic()
        weights, run, took = _train(_config(work, work / "chaos", 100_000), init, chaos)
        steps = len(took)
        print(f"with chaos: {steps} steps in {time.monotonic() - t0:.0f} s", flush=True)
        t0 = time.monotonic()
        clean, _, clean_took = _train(_config(work, work / "clean", 100_000), init, steps=steps)
        print(f"uninterrupted: {steps} steps in {time.monotonic() - t0:.0f} s", flush=True)
        _report(chaos, run, steps, took, clean_took, max((weights[k] - clean[k]).abs().max().item() for k in clean))


def _report(chaos, run, steps: int, took: list[float], clean_took: list[float], diff: float,
            workers: dict = WORKERS, redo: int = 3) -> None:
    """The soak's figures; `redo` is the most steps a recovery may do again (a rebuilt learner
    replays those since its checkpoint)."""
    trained = [e.trained for s in range(steps) for e in run.ledger.read(s).values()]
    lost = steps * run.rl.prompts_per_step - sum(1 for n in trained if n >= 1)
    twice = sum(1 for n in trained if n > 1)
    events = [json.loads(x) for x in run.paths.workers_log.read_text().splitlines()] \
        if run.paths.workers_log.exists() else []
    why = {}
    for e in (e for e in events if "why" in e):  # not the scale requests' records
        key = "learner group rebuilt" if e["role"] == "learner" else \
            next((k for k in ("died", "no heartbeat", "nothing written", "not started", "lease", "no answer to weights")
                  if k in e["why"]), e["why"])
        why[key] = why.get(key, 0) + 1
    print(f"faults {chaos.injected} ({', '.join(f'{k} {n}' for k, n in sorted(chaos.counts.items()))}), "
          f"wedged 0, lost groups {lost}, trained twice {twice}")
    print(f"replacements {sum(why.values())}: " + ", ".join(f"{k}: {n}" for k, n in sorted(why.items())))
    median = statistics.median(clean_took)
    start = max(chaos.starts, default=0.0)
    print(f"step time: median {statistics.median(took):.2f} s (uninterrupted {median:.2f} s); "
          f"a replacement's start to its first group: median {statistics.median(chaos.starts or [0.0]):.2f} s, max {start:.2f} s")
    # a learner rank lost (killed, stopped, or on a removed node) is found by a collective's timeout
    learner = any(k.startswith("learner") or k == "node" for k in chaos.counts)
    deadline = max(workers["silent_after_s"], workers["lease_ttl_s"],
                   workers.get("collective_min_s", 0.0) if learner else 0.0)
    for kind, times in sorted(chaos.recovery.items()):
        print(f"recovery after {kind}: median {statistics.median(times):.2f} s, max {max(times):.2f} s")
    worst = max(t for times in chaos.recovery.values() for t in times)
    # the longest a fault may take to be noticed (its deadline, the coordinator's poll, the 1 s
    # a stall report waits for the role's stacks), then a replacement's start-up and the steps
    bound = deadline + workers["silent_after_s"] / 4 + 1.0 + start + redo * median
    print(f"ratio max_recovery/(deadline + poll + report + start + {redo} steps): {worst / bound:.2f}")
    print(f"final weights: largest |difference| from the uninterrupted run {diff:.3g}")


if __name__ == "__main__":
    main()
