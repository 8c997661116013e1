"""The transport contract. A sender publishes weights version v and returns once every receiver
has acked it (or refused it: then the receiver serves nothing until a good version arrives).
A receiver is anything with `receive(payload) -> Ack` (a rollout worker); `receive_into` is
what one does with the payload."""
from __future__ import annotations

from dataclasses import dataclass

from hindsight.transport.payload import CorruptWeights, WeightVersion, verified


@dataclass(frozen=True)
class Ack:
    version: int
    ok: bool = True
    why: str = ""


class WeightSender:
    def publish(self, version: int, model) -> dict[str, float]:
        """Send `model`'s current weights as version `version` to every receiver; returns what it
        measured (bytes sent)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop sending (and drop what is kept for late receivers)."""


def receive_into(model, payload: WeightVersion):
    """Apply a payload to a receiver's `model`; returns (the model to serve from, its Ack). A
    shared payload is the sender's model itself; a payload that fails its checksum is refused."""
    if payload.shared is not None:
        return payload.shared, Ack(payload.version)
    try:
        model.load_state_dict(verified(payload))
    except CorruptWeights as exc:
        return model, Ack(payload.version, ok=False, why=str(exc))
    return model, Ack(payload.version)


def refused(acks: list[Ack]) -> list[Ack]:
    return [a for a in acks if not a.ok]
