"""The chaos soak on a multi-node Ray cluster (issue 47): a long tiny synchronous run whose roles
are Ray actors on raylets of their own (`ray.cluster_utils.Cluster` on this machine: a head
without CPUs, five raylets of one CPU: two rollout workers, learner rank 1, two spare), with
faults injected at random moments, then its ledger and final weights checked against an
uninterrupted run on the same cluster.

    python bench/chaos_nodes.py [--faults 100] [--seed 0]

The faults, one at a time, 1-3 s apart, each after the run has recovered from the one before:
- `kill`: SIGKILL of a rollout worker (replaced on a spare raylet);
- `pause` / `stop`: SIGSTOP of a rollout worker, SIGCONT shorter than `silent_after_s` (slow: left
  alone) or well after its lease deadline (stopped: replaced, its late work refused);
- `hang`: the scorer's next reward call never returns while its process lives (replaced);
- `node`: a raylet removed at once (its actors and object store gone), the one holding a rollout
  worker or learner rank 1, at random; then `add`: a fresh raylet joins, and `hindsight scale`
  asks for the two workers again, placed on it from the next step;
- `learner_kill` / `learner_stop`: SIGKILL, or SIGSTOP past the collective timeout, of learner
  rank 1: the group is rebuilt in the same attempt from the newest checkpoint, the stored steps
  since then trained again;
- `disk_full`: every write of the run fails with ENOSPC for 1-3 s (`disk_full_while`), waited out.

Prints the same lines as `bench/chaos.py`: `faults N (...), wedged 0, lost groups L, trained
twice T`, the replacements by reason, each kind's recovery time (injection to the end of the
second step after), `ratio max_recovery/(deadline + ...)`, and the final weights' largest
difference from the uninterrupted run (allclose, not equal: a rebuilt group's two ranks sum
gradients as the first did, but the replayed steps run from a checkpoint's saved state).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from chaos import Faults, _report, _resume, _train, workspace

WORKERS = {"heartbeat_s": 0.25, "silent_after_s": 3.0, "lease_ttl_s": 4.0, "lease_s_per_token": 0.0,
           "replacements": 100000, "stall_first_s": 600.0, "stall_min_s": 120.0, "collective_min_s": 8.0,
           "placement": "ray", "rollout": 2, "scorer": 1, "placement_timeout_s": 60,
           "resources": {"rollout": {"num_cpus": 1}, "scorer": {"num_cpus": 0}, "learner": {"num_cpus": 1}}}
KINDS = ["kill", "pause", "stop", "hang", "node", "learner_kill", "learner_stop", "disk_full"]


def _config(work: Path, run_dir: Path, steps: int, address: str) -> dict:
    return {"name": "chaos-nodes", "seed": 5, "run_dir": str(run_dir),
            "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
            "rl": {"steps": steps, "prompts_per_step": 2, "samples_per_prompt": 4, "save_every": 5,
                   "rollout": {"max_new_tokens": 4, "groups_per_batch": 1},
                   "learner": {"lr": 1e-3, "processes": 2, "health": {"enabled": False}},
                   "scoring": {"rewards": [{"fn": "chaos_reward:flaky"}], "isolation": "inline"},
                   "workers": {**WORKERS, "ray_address": address}}}


def _actors(title: str) -> list[int]:
    """The pids of the live Ray actor processes of class `title` (Ray names them `ray::Class`)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if cmd.startswith(f"ray::{title}".encode()) and state not in "ZT":  # not dead, not stopped already
                pids.append(int(d.name))
    return pids


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


class NodeChaos(Faults):
    """Faults, one at a time, into the cluster's actors and raylets; each recovery is timed from
    the injection to the end of the second step completed after it."""

    def __init__(self, rng: random.Random, cluster, marker: Path, full: Path, most: int, kinds=KINDS):
        super().__init__(rng, marker, most)
        self.cluster, self.full, self.kinds, self.wanted = cluster, full, list(kinds), threading.Event()

    @property
    def starts(self) -> list[float]:
        """The start-up of every replacement actor (the pools' first ones not counted)."""
        return [t for pool in (self.run.pool.rollout, self.run.pool.scorer) for t in pool.start_s[WORKERS[pool.role]:]]

    def _loop(self) -> None:
        while self.injected < self.most and not self._done.wait(self.rng.uniform(1.0, 3.0)):
            kind = self.rng.choice(self.kinds)
            t0 = time.monotonic()
            try:
                after = getattr(self, f"_{kind}")()
            except (ProcessLookupError, IndexError, FileNotFoundError, LookupError) as exc:
                if os.environ.get("CHAOS_VERBOSE"):
                    print(f"{time.time():.2f} {kind}: nothing to hit ({exc!r})", flush=True)
                continue  # nothing to hit just now (between a death and its replacement)
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self._recovered(kind, t0)
            if after is not None:
                after()
            if os.environ.get("CHAOS_VERBOSE"):
                print(f"{time.time():.2f} {kind} step {len(self.took)} recovered in "
                      f"{self.recovery[kind][-1]:.2f} s", flush=True)
        self.last_step = len(self.took)
        self.finished.set()

    def _recovered(self, kind: str, t0: float) -> None:
        done = len(self.took)
        while len(self.took) < done + 2 and not self._done.is_set():
            time.sleep(0.02)
        self.recovery.setdefault(kind, []).append(time.monotonic() - t0)

    def _signal_for(self, pid: int, sig: int, held_s: float):
        """Stop `pid` now and continue it after `held_s`; the returned wait holds the next fault
        back until then (a stopped process is not hit again)."""
        os.kill(pid, sig)
        timer = threading.Timer(held_s, _resume, args=(pid,))
        timer.start()
        return timer.join

    def _kill(self):
        os.kill(self.rng.choice(_actors("RolloutActor")), signal.SIGKILL)

    def _pause(self):
        return self._signal_for(self.rng.choice(_actors("RolloutActor")), signal.SIGSTOP,
                                WORKERS["silent_after_s"] * self.rng.uniform(0.1, 0.5))

    def _stop(self):
        return self._signal_for(self.rng.choice(_actors("RolloutActor")), signal.SIGSTOP,
                                WORKERS["lease_ttl_s"] * 3)

    def _hang(self):
        if not _actors("ScorerActor"):
            raise IndexError("no scorer")
        self.marker.touch()  # the scorer's next reward call never returns

    def _learner_kill(self):
        os.kill(_actors("LearnerRank")[0], signal.SIGKILL)

    def _learner_stop(self):
        return self._signal_for(_actors("LearnerRank")[0], signal.SIGSTOP, WORKERS["collective_min_s"] + 6)

    def _disk_full(self):
        self.full.touch()
        timer = threading.Timer(self.rng.uniform(1.0, 3.0), self.full.unlink)
        timer.start()
        return timer.join

    def _node(self):
        """Remove the raylet of a rollout worker or of learner rank 1; the fresh raylet that
        replaces it, and the request for two workers again, come after the recovery."""
        raylets = {n.all_processes["raylet"][0].process.pid: n for n in self.cluster.worker_nodes}
        pid = self.rng.choice(_actors("RolloutActor") + _actors("LearnerRank"))
        if _parent(pid) not in raylets:
            raise LookupError(f"pid {pid}'s parent {_parent(pid)} is no raylet's ({sorted(raylets)})")
        node = raylets[_parent(pid)]
        self.cluster.remove_node(node, allow_graceful=False)
        return self._add

    def _add(self):
        """Ask the training loop for a raylet at its next step boundary (Ray starts one only from
        the main thread), then for two workers again; its recovery ends two steps after."""
        t0 = time.monotonic()
        self.wanted.set()
        while self.wanted.is_set() and not self._done.is_set():
            time.sleep(0.02)
        self.counts["add"] = self.counts.get("add", 0) + 1
        self._recovered("add", t0)

    def boundary(self) -> None:
        """Called by the training loop between steps: add the raylet asked for."""
        if self.wanted.is_set():
            self.cluster.add_node(num_cpus=1)
            (self.run.dir / "scale.json").write_text(json.dumps({"rollout": WORKERS["rollout"]}))
            self.wanted.clear()


def _cluster():
    import ray
    from ray.cluster_utils import Cluster

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every raylet on loopback
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(5):
        nodes.add_node(num_cpus=1)
    return ray, nodes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", default=",".join(KINDS), help="the faults to draw from, comma-separated")
    args = parser.parse_args()
    import transformers

    transformers.utils.logging.disable_progress_bar()  # a bar for each checkpoint's save, every 5 steps
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        init = workspace(work)
        # the raylets, and through them every actor, inherit these: set before the cluster starts
        os.environ.update({"CHAOS_HANG": str(work / "hang"), "CHAOS_STAGE_PID": str(os.getpid()),
                           "HINDSIGHT_FAULT": f"disk_full_while:{work / 'full'}",
                           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
        ray, nodes = _cluster()
        try:
            chaos = NodeChaos(random.Random(args.seed), nodes, work / "hang", work / "full", args.faults,
                              args.kinds.split(","))
            t0 = time.monotonic()
            weights, run, took = _train(_config(work, work / "chaos", 100_000, nodes.address), init, chaos)
            steps = len(took)
            print(f"with chaos: {steps} steps in {time.monotonic() - t0:.0f} s", flush=True)
            while len(nodes.worker_nodes) < 5:  # the same cluster for the uninterrupted run
                nodes.add_node(num_cpus=1)
            t0 = time.monotonic()
            clean, _, clean_took = _train(_config(work, work / "clean", 100_000, nodes.address), init, steps=steps)
            print(f"uninterrupted: {steps} steps in {time.monotonic() - t0:.0f} s", flush=True)
            diff = max((weights[k] - clean[k]).abs().max().item() for k in clean)
            # a rebuilt learner trains again the steps since its checkpoint (save_every), then 2 more
            _report(chaos, run, steps, took, clean_took, diff, WORKERS, redo=run.rl.save_every + 3)
        finally:
            ray.shutdown()
            nodes.shutdown()


if __name__ == "__main__":
    main()
