"""Ray: one payload put into Ray's object store per version and read by every rollout actor
(`receive`); the newest one is kept, so an actor started later (a replacement, a scale-up)
syncs to it before its first lease. The `ray` module is handed in by the placement module,
the only one that imports it."""
from __future__ import annotations

from hindsight.errors import StageError
from hindsight.transport.base import WeightSender, refused
from hindsight.transport.payload import full_version


class RaySender(WeightSender):
    def __init__(self, ray, actors: dict):
        self.ray, self.actors = ray, actors  # the pool's own dict: actors it adds are published to
        self.version, self.ref = None, None

    def publish(self, version: int, model) -> dict[str, float]:
        payload = full_version(version, model.state_dict())
        self.version, self.ref = version, self.ray.put(payload)
        acks = self.ray.get([a.receive.remote(self.ref) for a in self.actors.values()])
        _check(acks)
        return {"publish/bytes": float(payload.nbytes)}

    def sync(self, actor) -> None:
        """A late receiver takes the newest version before it serves anything."""
        if self.ref is not None:
            _check([self.ray.get(actor.receive.remote(self.ref))])

    def close(self) -> None:
        self.ref = None


def _check(acks) -> None:
    bad = refused(acks)
    if bad:  # the store's copy is what every actor read: a refusal is a broken transport, not noise
        raise StageError(f"a rollout actor refused weights version {bad[0].version}: {bad[0].why}")
