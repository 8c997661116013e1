"""A pipe: a JSON header line, then safetensors bytes (no pickle), to the async sampler's process;
it acks each version on its result pipe. The framing is `send`/`recv`, also the sampler's
command and result messages."""
from __future__ import annotations

import json

from hindsight.transport.base import WeightSender
from hindsight.transport.delta import Publication
from hindsight.transport.payload import to_bytes


def send(fh, header: dict, payload: bytes = b"") -> None:
    """One message: a JSON header line with the payload's size, then the payload."""
    fh.write(json.dumps({**header, "nbytes": len(payload)}).encode() + b"\n" + payload)
    fh.flush()


def recv(fh) -> tuple[dict, bytes] | None:
    line = fh.readline()
    if not line:
        return None  # the other end closed
    header = json.loads(line)
    return header, fh.read(header["nbytes"]) if header["nbytes"] else b""


class PipeSender(WeightSender):
    """Sends without waiting: the sampler reads commands in order, so a version is applied before
    the next step it is asked to sample; its ack (or refusal) comes back with the results. After
    the first version it sends deltas (`transport.delta`): a pipe loses nothing, so a refused one
    is a torn stream, which fails the step (`AsyncSampler.wait`); the stage's retry starts a new
    sampler, whose first version is a full copy."""

    def __init__(self, fh, publication: Publication | None = None):
        self.fh, self.publication = fh, publication or Publication()

    def publish(self, version: int, model) -> dict[str, float]:
        payload = self.publication.next(version, model.state_dict())
        header, data = to_bytes(payload)
        send(self.fh, {"kind": "weights", **header}, data)
        return {"publish/bytes": float(len(data)), "publish/delta": float(payload.base is not None)}
