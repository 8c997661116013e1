"""A test-only weight transport, written as docs/design.md says adding one takes: one file, a
`WeightSender`. Every version is a full copy with its checksum, which each receiver checks and
applies (`transport.base.receive_into`) and acks; a refusal fails the publish."""
from hindsight.transport.base import WeightSender, refused
from hindsight.transport.delta import Publication


class CopySender(WeightSender):
    def __init__(self, receivers: list):
        self.receivers, self.publication, self.versions = receivers, Publication(full_every=1), []

    def publish(self, version: int, model) -> dict[str, float]:
        payload = self.publication.next(version, model.state_dict())
        bad = refused([r.receive(payload) for r in self.receivers])
        if bad:
            raise RuntimeError(f"weights version {version} refused: {bad[0].why}")
        self.versions.append(version)
        return {"publish/bytes": float(payload.nbytes)}
