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
import sys
import time
from functools import partial
from pathlib import Path

import torch

from hindsight.coordination.liveness import tokens_per_sample, work_deadline_s
from hindsight.errors import ConfigError
from hindsight.fsutil import append_line, atomic_write_json, read_json
from hindsight.state.ledger import Ledger
from hindsight.state.rundir import RLDir
from hindsight.coordination.roles import deal
from hindsight.coordination.pools.base import leases
from hindsight.rollout.tasks import GroupTask
from hindsight.rollout.worker import RolloutWorker
from hindsight.scoring.rewards import add_failures
from hindsight.scoring.scorer import Scorer, score_batch
from hindsight.transport.delta import Publication
from hindsight.transport.ray import RaySender

log = logging.getLogger("hindsight.workers")


def start_ray(address: str | None, needs: dict[str, float] | None = None, wait_s: float = 30.0):
    """Join `address` (or $RAY_ADDRESS), else start an embedded local Ray sized to this machine.
    Refuses a worker layout that asks for more CPUs or GPUs than the cluster has, before any model loads."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        loopback_only()
    import ray

    if not ray.is_initialized():
        kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False, ignore_reinit_error=True)
        try:
            if address:
                _reachable(address, wait_s)
                ray.init(address=address, **kwargs)
            else:
                # "local": a cluster of our own, never one a `ray start` on this machine left in
                # /tmp/ray/ray_current_cluster (joining that one is what ray_address is for)
                ray.init(address="local", num_cpus=os.cpu_count() or 1, **kwargs)
        except ConfigError:
            raise
        except Exception as exc:  # ray raises several types for an unreachable or broken cluster
            raise ConfigError(f"rl.workers: cannot start or join Ray at {address or 'a local embedded cluster'}: "
                              f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    for kind, need in (needs or {}).items():
        have = ray.cluster_resources().get(kind, 0.0)
        if need > have:
            raise ConfigError(f"rl.workers asks for {need:g} {kind}s, but the Ray cluster has {have:g}")
    return ray


def _free(ray) -> dict[str, float]:
    free = ray.available_resources()
    return {k: float(free.get(k, 0.0)) for k in ("CPU", "GPU")}


def loopback_only() -> None:
    """The embedded cluster binds 127.0.0.1 only (its GCS, raylets, workers, metrics agent). On
    Linux, Ray 2.60 resolves a node IP of 127.0.0.1 to the machine's address and binds its gRPC
    servers on every interface; with its single-machine mode (the switch it uses on macOS and
    Windows, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) the node is localhost and every server binds
    loopback. Set before Ray starts; its processes inherit it. Not for a cluster joined by address."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:  # ray imported already: the constant was read at import
        constants.ENABLE_RAY_CLUSTER = False


def actor_env(workers) -> dict[str, str]:
    env = {k: os.environ[k] for k in ("HINDSIGHT_FAULT",) if k in os.environ}  # the fault tests' hook
    if not (workers.ray_address or os.environ.get("RAY_ADDRESS")):
        # an embedded cluster runs this machine's code: its actors import what this process can
        # (a reward module beside the config, not installed), as a reward worker process does
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _reachable(address: str, wait_s: float) -> None:
    """A bounded check, so a wrong address is one clear error, not Ray's long retry loop."""
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=wait_s).close()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"rl.workers.ray_address: {address} cannot be reached ({exc})") from None


class _Pool:
    """Actors of one role: started, replaced when one dies, every death recorded."""
    role = "worker"

    def __init__(self, actor_cls, n: int, workers, rl_dir: Path, args: tuple, ledger: Ledger | None = None):
        self.ray = start_ray(workers.ray_address)  # the stage's preflight checked the cluster's size
        res = workers.of(self.role)
        self.actor_cls = self.ray.remote(num_cpus=res.num_cpus, num_gpus=res.num_gpus, max_restarts=0,
                                         runtime_env={"env_vars": actor_env(workers)})(actor_cls)
        self.paths, self.workers, self.args = RLDir(rl_dir), workers, args
        self.placement_s, self.each = workers.placement_timeout_s, res
        self.ledger = ledger or Ledger(rl_dir)
        self.actors, self.hosts, self.spawned, self.deaths, self.reassigned = {}, {}, 0, 0, 0
        self.start_s: list[float] = []  # each actor's start-up, in order
        for _ in range(n):
            self._spawn()
        if not self.actors:
            raise ConfigError(f"rl.workers: no {self.role} actor could be placed on the Ray cluster within "
                              f"{self.placement_s:g} s (rl.workers.placement_timeout_s)")

    def _spawn(self) -> str | None:
        """Start one actor; None when the cluster has not placed it within placement_timeout_s (it
        is dropped with a log line: the pool keeps the actors it has, rather than waiting forever)."""
        for attempt in range(1, 4):
            actor_id = f"{self.role}-{self.spawned}"
            self.spawned += 1
            actor, t0 = self.actor_cls.remote(actor_id, *self.args), time.monotonic()
            try:
                self.hosts[actor_id] = self.ray.get(actor.where.remote(), timeout=self.placement_s)  # for the death record
                break
            except self.ray.exceptions.GetTimeoutError:
                self.ray.kill(actor)
                log.warning("%s %s could not be placed on the Ray cluster within %g s: dropped (free now: %s)",
                            self.role, actor_id, self.placement_s, _free(self.ray))
                return None
            except self.ray.exceptions.RayActorError as exc:  # placed on a node that was going down: once more
                log.warning("%s %s died while starting (attempt %d of 3): %s", self.role, actor_id, attempt,
                            str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        else:
            return None
        self.actors[actor_id] = actor
        self.start_s.append(time.monotonic() - t0)  # placed, its models loaded: ready to serve
        return actor_id

    def _replace(self, step: int, actor_id: str, why: str, written: list[int], back: list[int]) -> None:
        self.ray.kill(self.actors.pop(actor_id))
        new_id = self._spawn()
        if new_id is None and not self.actors:
            raise ConfigError(f"rl.workers: the last {self.role} actor {why} and no replacement could be placed")
        self.deaths += 1
        self.reassigned += len(back)
        event = {"time": time.time(), "step": step, "role": self.role, "worker": actor_id,
                 "host": self.hosts.pop(actor_id, "?"), "why": why, "written": written, "reassigned": back,
                 "replacement": new_id}
        append_line(self.paths.workers_log, json.dumps(event))
        log.warning("%s %s on %s %s at step %d: kept groups %s, reassigning %s; started %s",
                    self.role, actor_id, event["host"], why, step, written, back, new_id)

    def deadline_s(self, groups: int) -> float:
        """The lease of a share of `groups` groups: a floor plus seconds per token of its budget
        (`coordination.liveness.work_deadline_s`), so a long group is not taken for a hung one."""
        return work_deadline_s(self.workers, groups * self.rl.samples_per_prompt * tokens_per_sample(self.rl))

    def _run(self, calls: dict, deadline_s: float):
        """Wait for the calls (ref -> actor id) up to the deadline of the largest share; yields
        (actor id, result or None if the actor died or overran, why)."""
        done, late = self.ray.wait(list(calls), num_returns=len(calls), timeout=deadline_s)
        for ref in done:
            try:
                result = self.ray.get(ref)
            except self.ray.exceptions.RayActorError:
                yield calls[ref], None, "died"
                continue
            except self.ray.exceptions.RayTaskError as exc:  # the role's own error: raise it as itself
                raise exc.as_instanceof_cause() from None
            yield calls[ref], result, None
        for ref in late:
            yield calls[ref], None, "lease expired"

    def metrics(self) -> dict:
        return {f"workers/{self.role}_deaths": float(self.deaths),
                f"workers/{self.role}_reassigned_groups": float(self.reassigned)}

    def close(self) -> None:
        for actor in self.actors.values():
            self.ray.kill(actor)
        self.actors = {}


class RayRolloutPool(_Pool):
    role = "rollout"

    def __init__(self, n: int, rl, policy_path: str, dtype: str, seed: int, rl_dir: Path, init_path: str,
                 version: int, ledger: Ledger | None = None):
        self.version, self.rl, self.sender, self.step = version, rl, None, 0
        super().__init__(RolloutActor, n, rl.workers, rl_dir, (policy_path, dtype, rl, seed, str(rl_dir), init_path,
                                                              version), ledger)
        self.sender = RaySender(self.ray, self.actors, Publication(getattr(torch, dtype), rl.rollout.publish_full_every),
                                deadline_s=rl.workers.lease_ttl_s)

    def _spawn(self) -> str:
        actor_id = super()._spawn()
        if actor_id is not None and self.sender is not None:  # a restarted or added worker syncs before it serves
            try:
                self.sender.sync(self.actors[actor_id])
            except (self.ray.exceptions.GetTimeoutError, self.ray.exceptions.RayActorError) as exc:
                # stopped, or its node gone, before it held the weights: not one to keep
                self.ray.kill(self.actors.pop(actor_id))
                log.warning("rollout %s took no weights (%s; rl.workers.lease_ttl_s %g): dropped", actor_id,
                            type(exc).__name__, self.rl.workers.lease_ttl_s)
                return None
        return actor_id

    def resize(self, step: int) -> None:
        """Apply a `hindsight scale` request (`rl/scale.json`) at a step boundary: an added worker
        syncs the current weights before its first lease; a removed one finished its last lease. A
        request the cluster cannot place is refused, with what it needs against what is free
        (`rl/scale-result.json`, read by `hindsight scale`), and the run keeps its workers."""
        request = read_json(self.paths.scale_request, default=None) or {}
        want = request.get("rollout")
        if not want or want == len(self.actors) or request == (read_json(self.paths.scale_result) or {}).get("request"):
            return
        before = list(self.actors)
        need = {"CPU": (want - len(before)) * self.each.num_cpus, "GPU": (want - len(before)) * self.each.num_gpus}
        free = _free(self.ray)
        short = {k: v for k, v in need.items() if v > 0 and v > free.get(k, 0.0) + 1e-9}
        if short:
            why = (f"--rollout {want} needs {', '.join(f'{v:g} more {k}s' for k, v in short.items())} "
                   f"({self.each.num_cpus:g} CPU, {self.each.num_gpus:g} GPU each), but the Ray cluster has "
                   f"{', '.join(f'{free.get(k, 0.0):g} {k}s' for k in short)} free; kept {len(before)} workers")
            atomic_write_json(self.paths.scale_result, {"request": request, "refused": why, "step": step})
            log.warning("hindsight scale refused at step %d: %s", step, why)
            return
        while len(self.actors) < want and self._spawn() is not None:
            pass
        for actor_id in list(self.actors)[want:]:
            self.ray.kill(self.actors.pop(actor_id))
        event = {"time": time.time(), "step": step, "role": self.role, "scaled": [len(before), len(self.actors)],
                 "workers": list(self.actors)}
        append_line(self.paths.workers_log, json.dumps(event))
        atomic_write_json(self.paths.scale_result, {"request": request, "scaled": [len(before), len(self.actors)],
                                                    "step": step})
        log.warning("rollout workers scaled from %d to %d at step %d", len(before), len(self.actors), step)

    def publish(self, version: int, model) -> dict[str, float]:
        """A new weights version for every actor, through Ray's object store (`transport.ray`)."""
        self.version = version
        sent = self.sender.publish(version, model)
        for actor_id in self.sender.dead:  # found dead on delivery (its node gone): it held no lease
            self._replace(self.step, actor_id, "died", [], [])
        for actor_id in self.sender.silent:  # stopped: it would hold the next lease until it expired
            self._replace(self.step, actor_id, f"no answer to weights version {version} within "
                                               f"{self.rl.workers.lease_ttl_s:g} s", [], [])
        return sent

    def dispatch(self, step: int, todo: list[GroupTask], tasks: list[GroupTask], version: int, store) -> None:
        """Lease every group of `todo` (among the round's `tasks`) until all are sealed."""
        todo, self.step = list(todo), step  # only what is left: a resumed step has sealed groups already
        while todo:  # a reassigned group is sampled in its own batch again
            shares = dict(leases(self.ledger, step, todo, tasks, list(self.actors), self.rl.rollout.groups_per_batch,
                                 self.deadline_s))
            calls = {self.actors[actor_id].generate.remote(share, version): actor_id for actor_id, share in shares.items()}
            widest = max((len(share) for share in shares.values()), default=0)
            for actor_id, sealed, why in self._run(calls, self.deadline_s(widest)):
                if why is None:
                    self.ledger.move(step, sealed, "sealed")
                    continue
                leased = [g for g, e in self.ledger.read(step).items() if e.state == "leased" and e.worker == actor_id]
                written = [g for g in leased if store.has_part("rollouts", step, g)]
                if written:
                    self.ledger.move(step, written, "sealed")
                self._replace(step, actor_id, why, written, self.ledger.take_back(step, actor_id))
            todo = [t for t in tasks if t.group in self.ledger.in_state(step, "pending")]


class RayScorerPool(_Pool):
    role = "scorer"

    def __init__(self, n: int, rl, init_path: str, rm_path: str | None, dtype: str, rl_dir: Path):
        self.rl = rl
        super().__init__(ScorerActor, n, rl.workers, rl_dir, (rl, init_path, rm_path, dtype, str(rl_dir)))

    def dispatch(self, step: int, groups: list[int], store) -> dict[str, list]:
        """Score every group (a part each); a dead scorer's unwritten groups go to its replacement."""
        failures: dict[str, list] = {}
        todo = list(groups)
        while todo:
            calls, given = {}, {}
            unit = partial(score_batch, groups_per_batch=self.rl.rollout.groups_per_batch)
            for actor_id, share in zip(list(self.actors), deal(todo, len(self.actors), unit)):
                if share:
                    calls[self.actors[actor_id].score.remote(step, share)] = actor_id
                    given[actor_id] = share
            widest = max((len(share) for share in given.values()), default=0)
            for actor_id, counts, why in self._run(calls, self.deadline_s(widest)):
                if why is None:
                    add_failures(failures, counts)
                    continue
                written = [g for g in given[actor_id] if store.has_part("scores", step, g)]
                self._replace(step, actor_id, why, written, [g for g in given[actor_id] if g not in written])
            todo = [g for g in groups if not store.has_part("scores", step, g)]
        return failures


class ScorerActor:
    """A scorer in its own process, with its own reference model, reward model and reward worker."""

    def __init__(self, scorer_id: str, rl, init_path: str, rm_path: str | None, dtype: str, store_root: str):
        self.scorer = Scorer.from_paths(scorer_id, rl, init_path, rm_path, dtype, store_root)

    def score(self, step: int, groups: list[int]) -> dict[str, int]:
        return self.scorer.score(step, groups)

    def where(self) -> str:
        return _where()


class RolloutActor:
    """A rollout worker in its own process, built there from files (a model is never pickled)."""

    def __init__(self, worker_id: str, policy_path: str, dtype: str, rl, seed: int, store_root: str, init_path: str,
                 version: int):
        self.worker = RolloutWorker.from_paths(worker_id, policy_path, dtype, rl, seed, store_root, init_path)
        self.worker.start_at(version)

    def receive(self, payload):
        return self.worker.receive(payload)

    def generate(self, tasks: list[GroupTask], version: int) -> list[int]:
        return self.worker.generate(tasks, version)

    def where(self) -> str:
        return _where()


def _where() -> str:
    """host:pid:Ray node id, for the death record: which node dropped out."""
    import socket

    import ray

    return f"{socket.gethostname()}:{os.getpid()}:{ray.get_runtime_context().get_node_id()}"
