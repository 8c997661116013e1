"""Rollout workers as Ray actors: the only module that imports ray (lazily, when used).

The coordinator (the RL stage) leases groups to the actors through the ledger. When an actor
dies (Ray reports it) or its lease expires, the groups it had not written go back to pending
and are leased again, to a healthy actor or to a restarted one, which first takes the current
weights version. Each group's seed is fixed, so the regenerated group is the one that was
lost. Every death and reassignment is logged, written to `rl/workers.jsonl` and counted.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from hindsight.errors import ConfigError
from hindsight.fsutil import append_line
from hindsight.ledger import Ledger
from hindsight.roles.rollout import GroupTask, RolloutWorker

log = logging.getLogger("hindsight.workers")


def start_ray(address: str | None, need_cpus: float, wait_s: float = 30.0):
    """Join `address` (or $RAY_ADDRESS), else start an embedded local Ray sized to this machine.
    Refuses a worker layout that asks for more CPUs than the cluster has, before any model loads."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS")
    if not ray.is_initialized():
        kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False, ignore_reinit_error=True)
        try:
            if address:
                _reachable(address, wait_s)
                ray.init(address=address, **kwargs)
            else:
                ray.init(num_cpus=os.cpu_count() or 1, **kwargs)
        except ConfigError:
            raise
        except Exception as exc:  # ray raises several types for an unreachable or broken cluster
            raise ConfigError(f"rl.workers: cannot start or join Ray at {address or 'a local embedded cluster'}: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    have = ray.cluster_resources().get("CPU", 0.0)
    if need_cpus > have:
        raise ConfigError(f"rl.workers asks for {need_cpus:g} CPUs, but the Ray cluster has {have:g}")
    return ray


def _reachable(address: str, wait_s: float) -> None:
    """A bounded check, so a wrong address is one clear error, not Ray's long retry loop."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=wait_s).close()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"rl.workers.ray_address: {address} cannot be reached ({exc})") from None


class RayRolloutPool:
    def __init__(self, n: int, rl, policy_path: str, dtype: str, seed: int, rl_dir: Path, init_path: str):
        w = rl.workers
        self.ray = start_ray(w.ray_address, n * w.num_cpus)
        fault = {k: os.environ[k] for k in ("HINDSIGHT_FAULT",) if k in os.environ}  # the fault tests' hook
        self.actor_cls = self.ray.remote(num_cpus=w.num_cpus, max_restarts=0,
                                         runtime_env={"env_vars": fault} if fault else None)(RolloutActor)
        self.args = (rl, seed, str(rl_dir), init_path)
        self.dtype, self.ttl, self.dir = dtype, w.lease_ttl_s, Path(rl_dir)
        self.ledger = Ledger(rl_dir)
        self.version, self.weights, self.spawned = 0, None, 0
        self.actors = {}
        self.policy_path = policy_path
        for _ in range(n):
            self._spawn()
        self.deaths = self.reassigned = 0

    def _spawn(self) -> str:
        worker_id = f"rollout-{self.spawned}"
        self.spawned += 1
        rl, seed, store_root, init_path = self.args
        actor = self.actor_cls.remote(worker_id, self.policy_path, self.dtype, rl, seed, store_root, init_path)
        if self.weights is not None:  # a restarted or added worker serves nothing before it syncs
            self.ray.get(actor.load_weights.remote(self.version, self.weights))
        self.actors[worker_id] = actor
        return worker_id

    def publish(self, version: int, state_dict) -> None:
        """A new weights version for every actor, through Ray's object store (put once)."""
        self.version, self.weights = version, self.ray.put(state_dict)
        self.ray.get([a.load_weights.remote(version, self.weights) for a in self.actors.values()])

    def dispatch(self, step: int, tasks: list[GroupTask], store) -> dict:
        """Lease every task's group until all are sealed; returns this dispatch's worker metrics."""
        deaths = reassigned = 0
        todo = list(tasks)
        while todo:
            running = {}
            for worker_id, share in zip(list(self.actors), _deal(todo, len(self.actors))):
                if share:
                    self.ledger.move(step, [t.group for t in share], "leased", worker=worker_id, ttl_s=self.ttl)
                    running[self.actors[worker_id].generate.remote(share, self.version)] = worker_id
            done, late = self.ray.wait(list(running), num_returns=len(running), timeout=self.ttl)
            for ref in done:
                try:
                    self.ledger.move(step, self.ray.get(ref), "sealed")
                except self.ray.exceptions.RayActorError:
                    reassigned += self._lost(step, running[ref], store, "died")
                    deaths += 1
            for ref in late:
                self.ray.kill(self.actors[running[ref]])
                reassigned += self._lost(step, running[ref], store, "lease expired")
                deaths += 1
            todo = [t for t in tasks if t.group in self.ledger.in_state(step, "pending")]
        self.deaths += deaths
        self.reassigned += reassigned
        return {"workers/deaths": float(self.deaths), "workers/reassigned_groups": float(self.reassigned)}

    def _lost(self, step: int, worker_id: str, store, why: str) -> int:
        """A worker is gone: seal what it wrote, take back the rest, and start a replacement."""
        leased = [g for g, e in self.ledger.read(step).items() if e.state == "leased" and e.worker == worker_id]
        written = [g for g in leased if store.has_part("rollouts", step, g)]
        if written:
            self.ledger.move(step, written, "sealed")
        back = self.ledger.take_back(step, worker_id)
        del self.actors[worker_id]
        new_id = self._spawn()
        event = {"time": time.time(), "step": step, "worker": worker_id, "why": why, "written": written,
                 "reassigned": back, "replacement": new_id}
        append_line(self.dir / "workers.jsonl", json.dumps(event))
        log.warning("rollout worker %s %s at step %d: kept groups %s, reassigning %s; started %s",
                    worker_id, why, step, written, back, new_id)
        return len(back)

    def close(self) -> None:
        for actor in self.actors.values():
            self.ray.kill(actor)
        self.actors = {}


class RolloutActor:
    """A rollout worker in its own process, built there from files (a model is never pickled)."""

    def __init__(self, worker_id: str, policy_path: str, dtype: str, rl, seed: int, store_root: str, init_path: str):
        self.worker = RolloutWorker.from_paths(worker_id, policy_path, dtype, rl, seed, store_root, init_path)

    def load_weights(self, version: int, state_dict) -> None:
        self.worker.load_weights(version, state_dict)

    def generate(self, tasks: list[GroupTask], version: int) -> list[int]:
        return self.worker.generate(tasks, version)


def _deal(items: list, n: int) -> list[list]:
    return [items[i::n] for i in range(n)]
