"""The weight transport: one contract, its ways of moving a version. A payload's checksum is
checked before anything is loaded (a flipped bit is refused, and the receiver then serves
nothing until a good version), the pipe carries safetensors bytes and no pickle, in process
the receivers share the model, and the Ray sender puts a version once and syncs a late actor."""
import os

import pytest
import torch

from hindsight.errors import StageError
from hindsight.transport.base import Ack, receive_into
from hindsight.transport.inprocess import InProcessSender
from hindsight.transport.payload import CorruptWeights, from_bytes, full_version, verified
from hindsight.transport.pipe import PipeSender, recv
from hindsight.transport.ray import RaySender


def model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_a_payload_is_refused_when_one_bit_differs():
    payload = full_version(3, model().state_dict())
    assert verified(payload) is payload.tensors
    flipped = payload.tensors["0.weight"].view(torch.int32)
    flipped[0, 0] ^= 1
    with pytest.raises(CorruptWeights, match="weights version 3: checksum .* does not match"):
        verified(payload)


def test_the_pipe_carries_a_version_bit_equal_and_refuses_a_torn_one():
    sender, receiver = model(0), model(1)
    r, w = os.pipe()
    with os.fdopen(w, "wb") as out, os.fdopen(r, "rb") as inp:
        sent = PipeSender(out).publish(5, sender)
        header, data = recv(inp)
        assert header["kind"] == "weights" and sent["publish/bytes"] == len(data) and b"pickle" not in data
        got, ack = receive_into(receiver, from_bytes(header, data))
        assert ack == Ack(5) and got is receiver and same(receiver, sender)
        torn = bytearray(data)
        torn[-1] ^= 0xFF  # the last byte of the last tensor
        _, ack = receive_into(model(2), from_bytes(header, bytes(torn)))
        assert not ack.ok and "does not match" in ack.why
    with pytest.raises(CorruptWeights, match="unreadable"):
        from_bytes(header, data[:10])


def test_in_process_receivers_share_the_model():
    class Receiver:
        def receive(self, payload):
            self.policy, ack = receive_into(None, payload)
            self.version = payload.version
            return ack

    a, b, policy = Receiver(), Receiver(), model()
    InProcessSender([a, b]).publish(4, policy)
    assert a.policy is policy and b.policy is policy and a.version == b.version == 4


class StandInRay:
    """Ray's object store and remote calls as plain calls: the sender's own logic under test."""

    def __init__(self):
        self.puts = []

    def put(self, obj):
        self.puts.append(obj)
        return ("ref", len(self.puts))

    def get(self, refs, timeout=None):
        return [r.value for r in refs] if isinstance(refs, list) else refs.value

    def wait(self, refs, num_returns, timeout=None):
        return list(refs), []


class _Ref:
    """A remote call's handle: one per call (two actors' equal acks are still two calls)."""

    def __init__(self, value):
        self.value = value


class StandInActor:
    def __init__(self, ray, ok=True):
        self.ray, self.ok, self.model = ray, ok, model(7)
        outer = self

        class Remote:
            @staticmethod
            def remote(ref):
                payload = outer.ray.puts[ref[1] - 1]
                if not outer.ok:
                    return _Ref(Ack(payload.version, ok=False, why="checksum"))
                outer.model, ack = receive_into(outer.model, payload)
                return _Ref(ack)

        self.receive = Remote


def test_the_ray_sender_puts_each_version_once_and_syncs_a_late_actor():
    ray = StandInRay()
    actors = {"a": StandInActor(ray), "b": StandInActor(ray)}
    sender, policy = RaySender(ray, actors), model(3)
    sender.publish(1, policy)
    assert len(ray.puts) == 1 and all(same(a.model, policy) for a in actors.values())
    late = StandInActor(ray)
    sender.sync(late)
    assert same(late.model, policy) and len(ray.puts) == 1
    actors["c"] = StandInActor(ray, ok=False)
    with pytest.raises(StageError, match="refused weights version 2: checksum"):
        sender.publish(2, policy)


def test_a_worker_that_refused_a_version_serves_nothing(tmp_path):
    from helpers import rl_cfg, tiny_init
    from hindsight.models.load import load_causal_lm, load_tokenizer
    from hindsight.rollout.worker import RolloutWorker, StaleWeights
    from hindsight.state.store import RolloutStore

    init = tiny_init(tmp_path)
    policy = load_causal_lm(init)
    worker = RolloutWorker("w", policy, load_tokenizer(init), rl_cfg(tmp_path).rl, 0, RolloutStore(tmp_path / "s"), init)
    worker.start_at(0)
    bad = full_version(1, policy.state_dict())
    next(iter(bad.tensors.values())).view(torch.int32).view(-1)[0] ^= 1
    assert not worker.receive(bad).ok
    with pytest.raises(StaleWeights):
        worker.generate([], 1)
    good = full_version(2, policy.state_dict())
    assert worker.receive(good).ok and worker.version == 2
