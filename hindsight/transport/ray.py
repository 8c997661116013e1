"""Ray: one payload put into Ray's object store per version and read by every rollout actor
(`receive`): after the first version a delta (`transport.delta`), so the store holds only the
elements that changed. An actor that refuses it (it missed a version) gets the full copy at once,
before any lease; an actor started later (a replacement, a scale-up) takes the full copy before
its first lease. The `ray` module is handed in by the placement module, the only one that
imports it."""
from __future__ import annotations

from hindsight.errors import StageError
from hindsight.transport.base import WeightSender, refused
from hindsight.transport.delta import Publication


class RaySender(WeightSender):
    def __init__(self, ray, actors: dict, publication: Publication | None = None, deadline_s: float | None = None):
        self.ray, self.actors = ray, actors  # the pool's own dict: actors it adds are published to
        self.publication = publication or Publication()
        self.full_ref = None  # the newest full copy in the store, when there is one (for late actors)
        # a delivery is leased work too: an actor that has not acknowledged a version within this
        # (stopped, its node wedged) would otherwise hold every later step
        self.deadline_s = deadline_s
        self.dead: list[str] = []  # actors found dead by the last publish
        self.silent: list[str] = []  # actors that had not acknowledged it within deadline_s

    def publish(self, version: int, model) -> dict[str, float]:
        self.dead, self.silent = [], []
        payload = self.publication.next(version, model.state_dict())
        ref = self.ray.put(payload)
        self.full_ref = ref if payload.base is None else None
        acks = self._send(ref, list(self.actors))
        behind = [n for n, ack in acks.items() if not ack.ok]
        put = payload.nbytes  # what goes into the object store (every actor reads the one copy)
        if behind:  # missed a version (or a torn delta): the full copy, before anything is sampled
            full = self.publication.full()
            ref = self.full_ref = self.ray.put(full)
            _check(list(self._send(ref, behind).values()))
            put += full.nbytes
        return {"publish/bytes": float(put), "publish/delta": float(payload.base is not None),
                "publish/resent_full": float(len(behind))}

    def _send(self, ref, names: list[str]) -> dict:
        """Each actor's acknowledgement; an actor that died (its node gone, say) is left out and
        named in `self.dead`, one with no answer within the deadline in `self.silent`, for the
        pool to replace: a replacement takes the full copy."""
        calls = {self.actors[n].receive.remote(ref): n for n in names}
        done, late = self.ray.wait(list(calls), num_returns=len(calls), timeout=self.deadline_s)
        self.silent += [calls[c] for c in late]
        acks = {}
        for call in done:
            try:
                acks[calls[call]] = self.ray.get(call)
            except self.ray.exceptions.RayActorError:
                self.dead.append(calls[call])
        return acks

    def sync(self, actor) -> None:
        """A late receiver takes the full copy of the newest version before it serves anything."""
        if self.publication.version is None:
            return
        if self.full_ref is None:
            self.full_ref = self.ray.put(self.publication.full())
        _check([self.ray.get(actor.receive.remote(self.full_ref), timeout=self.deadline_s)])

    def close(self) -> None:
        self.publication.held, self.full_ref = None, None


def _check(acks) -> None:
    bad = refused(acks)
    if bad:  # the store's copy is what every actor read: a refusal is a broken transport, not noise
        raise StageError(f"a rollout actor refused weights version {bad[0].version}: {bad[0].why}")
