"""Weight publication as deltas (`hindsight.transport.delta`): after 20 versions of real AdamW
steps a bf16 receiver that took only deltas holds the sender's bits exactly; a receiver that
missed a delta refuses the next and is brought back by the full copy; a flipped bit is refused
and changes nothing; fp32 serving, where nearly every element moves, falls back to full copies."""
from __future__ import annotations

import copy

import pytest
import torch

from hindsight.transport.base import receive_into
from hindsight.transport.delta import Publication, aliases, decode_changes, encode_changes
from hindsight.transport.payload import from_bytes, to_bytes


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(300, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 300))


def train_step(m: torch.nn.Module, opt) -> None:
    tokens = torch.randint(0, 300, (8,))
    loss = torch.nn.functional.cross_entropy(m(tokens), torch.randint(0, 300, (8,)))
    opt.zero_grad()
    loss.backward()
    opt.step()


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].view(torch.int16), b[k].view(torch.int16)) for k in a)


def test_changes_round_trip_with_long_gaps_and_far_moves():
    old = torch.linspace(-3, 3, 70_000).to(torch.bfloat16)
    new = old.clone()
    changed = torch.tensor([0, 7, 300, 301, 65_535, 69_999])  # gaps of 1, 7, 293 (escaped), 1, ...
    new[changed] = old[changed] + torch.tensor([0.01, -0.01, 5.0, -0.0, 100.0, 1e-3]).to(torch.bfloat16)
    new[301] = -old[301]  # a sign flip: a far move of its bits
    parts = encode_changes(old, new)
    assert parts["gaps"].dtype == torch.uint8 and parts["diffs"].dtype == torch.int8
    assert parts["big_gaps"].numel() >= 1 and parts["far"].numel() >= 1  # both escapes exercised
    where, values = decode_changes(old.clone(), parts)
    moved = (new.view(torch.int16) != old.view(torch.int16)).nonzero().view(-1)
    assert torch.equal(where, moved) and torch.equal(values.view(torch.int16), new[moved].view(torch.int16))
    assert encode_changes(old, old.clone()) is None
    signed = torch.zeros(4, dtype=torch.bfloat16)
    flipped = signed.clone()
    flipped[1] = -0.0  # equal as values, not as bits: the receiver must get it
    assert decode_changes(signed, encode_changes(signed, flipped))[0].tolist() == [1]


def test_a_tied_matrix_goes_once_and_both_names_stay_equal():
    emb = torch.nn.Embedding(300, 64)
    head = torch.nn.Linear(64, 300, bias=False)
    head.weight = emb.weight  # tied, as tie_word_embeddings does
    sender = torch.nn.ModuleDict({"emb": emb, "head": head})
    assert aliases(sender.state_dict()) == {"head.weight": "emb.weight"}
    receiver = copy.deepcopy(sender).to(torch.bfloat16)
    untied = torch.nn.ModuleDict({"emb": torch.nn.Embedding(300, 64), "head": torch.nn.Linear(64, 300, bias=False)})
    untied.load_state_dict(receiver.state_dict())
    untied = untied.to(torch.bfloat16)
    pub = Publication(torch.bfloat16)
    pub.next(0, sender.state_dict())
    with torch.no_grad():
        emb.weight[:5] += 0.5
    payload = pub.next(1, sender.state_dict())
    assert "head.weight::alias" in payload.tensors and "head.weight::gaps" not in payload.tensors
    for target in (receiver, untied):  # tied like the sender, or holding two copies
        target, ack = receive_into(target, payload, 0)
        assert ack.ok, ack.why
        for name in ("emb.weight", "head.weight"):
            assert torch.equal(target.state_dict()[name], pub.held[name])


def test_twenty_versions_of_deltas_leave_the_receiver_bit_equal():
    sender = model()
    opt = torch.optim.AdamW(sender.parameters(), lr=1e-5)
    receiver = copy.deepcopy(sender).to(torch.bfloat16)
    pub, holds, kinds = Publication(torch.bfloat16, full_every=8), None, []
    for version in range(20):
        train_step(sender, opt)
        payload = pub.next(version, sender.state_dict())
        payload = from_bytes(*to_bytes(payload))  # as the pipe carries it
        receiver, ack = receive_into(receiver, payload, holds)
        assert ack.ok, ack.why
        holds = version
        kinds.append("full" if payload.base is None else "delta")
        full_bytes = sum(t.numel() * t.element_size() for t in pub.held.values())
        if payload.base is not None:
            assert payload.base == version - 1 and payload.nbytes < full_bytes / 4
        assert same_bits(receiver.state_dict(), pub.held)
        assert same_bits(pub.held, {k: v.to(torch.bfloat16) for k, v in sender.state_dict().items()})
    assert kinds == (["full"] + ["delta"] * 7) * 2 + ["full"] + ["delta"] * 3


def started():
    """A sender, its optimizer, its publication, and a bf16 receiver that holds version 0."""
    sender = model()
    opt = torch.optim.AdamW(sender.parameters(), lr=1e-5)
    pub = Publication(torch.bfloat16)
    receiver, ack = receive_into(copy.deepcopy(sender).to(torch.bfloat16), pub.next(0, sender.state_dict()), None)
    assert ack.ok
    return sender, opt, pub, receiver


def test_a_missed_delta_is_refused_and_the_full_copy_brings_the_receiver_back():
    sender, opt, pub, receiver = started()
    train_step(sender, opt)
    pub.next(1, sender.state_dict())  # lost on the way
    train_step(sender, opt)
    second = pub.next(2, sender.state_dict())
    before = copy.deepcopy(receiver.state_dict())
    receiver, ack = receive_into(receiver, second, 0)
    assert not ack.ok and "holds version 0" in ack.why and "full copy" in ack.why
    assert same_bits(receiver.state_dict(), before)  # nothing of it applied
    receiver, ack = receive_into(receiver, pub.full(), 0)
    assert ack.ok and same_bits(receiver.state_dict(), pub.held)


def test_a_flipped_bit_in_a_delta_is_refused_and_changes_nothing():
    sender, opt, pub, receiver = started()
    train_step(sender, opt)
    header, data = to_bytes(pub.next(1, sender.state_dict()))
    flipped = bytearray(data)
    flipped[-3] ^= 0x10  # inside the last tensor's bytes
    before = copy.deepcopy(receiver.state_dict())
    receiver, ack = receive_into(receiver, from_bytes(header, bytes(flipped)), 0)
    assert not ack.ok and "checksum" in ack.why
    assert same_bits(receiver.state_dict(), before)


@pytest.mark.parametrize("field,value", [("base", 1), ("version", 6)])
def test_a_flipped_header_is_refused_like_a_flipped_weight(field, value):
    """The checksum covers the version and the base: a receiver holding v1 given the v3 -> v4
    delta with its base flipped to 1 applied it and acked v4 with elements wrong; a flipped
    version made a receiver claim a version it did not hold."""
    sender, opt, pub, receiver = started()
    for v in (1, 2, 3):
        train_step(sender, opt)
        receiver, ack = receive_into(receiver, pub.next(v, sender.state_dict()), v - 1)
        assert ack.ok
    train_step(sender, opt)
    header, data = to_bytes(pub.next(4, sender.state_dict()))
    holds = 3
    if field == "base":
        holds = 1  # a receiver one version behind, which the flipped base would let in
    header = {**header, field: value}
    before = copy.deepcopy(receiver.state_dict())
    receiver, ack = receive_into(receiver, from_bytes(header, data), holds)
    assert not ack.ok and "checksum" in ack.why
    assert same_bits(receiver.state_dict(), before)


def _forged(pub, version, base, tensors):
    """A delta whose checksum matches its (malformed) content: what a buggy sender would send."""
    from hindsight.transport.payload import WeightVersion, checksum

    return WeightVersion(version, tensors, checksum(tensors, version, base), base=base)


def test_a_malformed_delta_is_a_refused_ack_and_changes_nothing():
    sender, opt, pub, receiver = started()
    train_step(sender, opt)
    good = pub.next(1, sender.state_dict())
    name = next(k.rpartition("::")[0] for k in good.tensors if k.endswith("::gaps"))
    past = dict(good.tensors)
    past[f"{name}::gaps"] = torch.cat([good.tensors[f"{name}::gaps"], torch.zeros(1, dtype=torch.uint8)])
    past[f"{name}::diffs"] = torch.cat([good.tensors[f"{name}::diffs"], torch.ones(1, dtype=torch.int8)])
    past[f"{name}::big_gaps"] = torch.cat([good.tensors[f"{name}::big_gaps"],  # a last position past the end
                                           torch.tensor([10**8], dtype=torch.int32)])
    missing = {"no.such.weight::whole": torch.zeros(3), **good.tensors}
    unknown = {**good.tensors, f"{name}::extra": torch.zeros(1)}
    short = {k: v for k, v in good.tensors.items() if k != f"{name}::diffs"}
    before = copy.deepcopy(receiver.state_dict())
    for tensors, why in ((past, "past its"), (missing, "does not hold"), (unknown, "not a part"), (short, "lacks")):
        receiver, ack = receive_into(receiver, _forged(pub, 1, 0, tensors), 0)
        assert not ack.ok and why in ack.why, ack.why
        assert same_bits(receiver.state_dict(), before)
    receiver, ack = receive_into(receiver, good, 0)
    assert ack.ok and same_bits(receiver.state_dict(), pub.held)


def test_fp32_serving_falls_back_to_full_copies():
    sender = model()
    opt = torch.optim.AdamW(sender.parameters(), lr=1e-3)
    pub = Publication(None)
    kinds = []
    for version in range(3):
        train_step(sender, opt)
        kinds.append(pub.next(version, sender.state_dict()).base)
    assert kinds == [None, None, None]  # AdamW moves every fp32 element: a delta would be larger
    with pytest.raises(ValueError):
        Publication(torch.bfloat16, full_every=0)
