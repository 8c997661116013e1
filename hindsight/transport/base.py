"""The transport contract. A sender publishes weights version v and returns once every receiver
has acked it (or refused it: then the receiver serves nothing until a good version arrives).
A receiver is anything with `receive(payload) -> Ack` (a rollout worker); `receive_into` is
what one does with the payload."""
from __future__ import annotations

from dataclasses import dataclass

from hindsight.transport.delta import MalformedDelta, apply_delta
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


def receive_into(model, payload: WeightVersion, holds: int | None = None):
    """Apply a payload to a receiver's `model`, which holds version `holds`; returns (the model
    to serve from, its Ack). A shared payload is the sender's model itself. A payload that fails
    its checksum, or a delta for a version the receiver does not hold, is refused before anything
    of it is applied; the sender answers a refusal with the full copy."""
    if payload.shared is not None:
        return payload.shared, Ack(payload.version)
    if payload.base is not None and payload.base != holds:
        return model, Ack(payload.version, ok=False, why=f"a delta from version {payload.base}, but this receiver "
                                                        f"holds version {holds}: it needs a full copy")
    try:
        tensors = verified(payload)
    except CorruptWeights as exc:
        return model, Ack(payload.version, ok=False, why=str(exc))
    try:
        if payload.base is None:
            model.load_state_dict(tensors)
        else:
            apply_delta(model, tensors)
    except (MalformedDelta, RuntimeError) as exc:  # checked before writing; load_state_dict checks keys and shapes first
        return model, Ack(payload.version, ok=False, why=f"weights version {payload.version}: {exc}")
    return model, Ack(payload.version)


def refused(acks: list[Ack]) -> list[Ack]:
    return [a for a in acks if not a.ok]
