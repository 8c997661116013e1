"""The group ledger: legal transitions only, leases taken back from a dead worker (the Ray pool
times out a lease past rl.workers.lease_ttl_s), no group trained twice, and a resume rolling
back what the kept weights lack."""
import json

import pytest

from hindsight.errors import CheckpointError, StorageError
from hindsight.state import ledger as ledger_module
from hindsight.state.ledger import Entry, Ledger


def test_a_group_moves_through_every_state_once(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.open(0, [0, 1])
    ledger.move(0, [0, 1], "leased", worker="w1", ttl_s=60)
    ledger.move(0, [0], "sealed")
    assert (ledger.in_state(0, "leased"), ledger.in_state(0, "sealed")) == ([1], [0])
    ledger.move(0, [1], "sealed")
    ledger.move(0, [0, 1], "scored")
    ledger.move(0, [0, 1], "trained")
    assert {g: e.trained for g, e in Ledger(tmp_path).read(0).items()} == {0: 1, 1: 1}  # from disk
    with pytest.raises(CheckpointError, match="group 0 cannot go from trained to trained"):
        ledger.move(0, [0], "trained")
    with pytest.raises(CheckpointError, match="group 1 cannot go from trained to sealed"):
        ledger.move(0, [1], "sealed")


def test_a_dead_workers_leases_go_back_to_pending_and_are_issued_again(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.open(3, [0, 1, 2, 3])
    ledger.move(3, [0, 1], "leased", worker="a", ttl_s=60)
    ledger.move(3, [2, 3], "leased", worker="b", ttl_s=60)
    ledger.move(3, [0], "sealed")  # a finished one group before it died
    assert ledger.take_back(3, "a") == [1]
    assert ledger.in_state(3, "pending") == [1]
    ledger.move(3, [1], "leased", worker="c", ttl_s=60)
    assert ledger.read(3)[1].leases == 2 and ledger.read(3)[1].worker == "c"


def test_resume_rolls_back_groups_trained_after_the_checkpoint(tmp_path):
    ledger = Ledger(tmp_path)
    for step in (0, 1):
        ledger.open(step, [0])
        ledger.move(step, [0], "leased", worker="w", ttl_s=60)
        ledger.move(step, [0], "sealed")
        ledger.move(step, [0], "scored")
        ledger.move(step, [0], "trained")
    ledger.open(2, [0])
    ledger.move(2, [0], "leased", worker="w", ttl_s=60)
    ledger.roll_back_after(1)  # the kept checkpoint has step 0's update only
    assert ledger.read(0)[0].state == "trained" and ledger.read(1)[0].state == "scored"
    assert ledger.read(1)[0].trained == 0 and ledger.read(2)[0].state == "pending"
    ledger.move(1, [0], "trained")  # trained once more, into the weights that are kept
    assert ledger.read(1)[0].trained == 1


def test_open_adds_later_rounds_without_touching_known_groups(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.open(0, [0, 1])
    ledger.move(0, [0], "leased", worker="w", ttl_s=60)
    entries = ledger.open(0, [0, 1, 2, 3])
    assert [entries[g].state for g in range(4)] == ["leased", "pending", "pending", "pending"]


def test_a_torn_append_leaves_the_state_before_it_and_later_transitions_land(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.open(0, [0, 1])
    ledger.move(0, [0, 1], "leased", worker="w", ttl_s=60)
    with open(ledger.path(0), "ab") as fh:  # a crash mid-append: a prefix of the next state's line
        fh.write(b'\n{"0":{"expiry":null,"leases":1,"state":"sea\xff')  # and a byte that is not UTF-8
    fresh = Ledger(tmp_path)  # a resumed process: nothing remembered
    assert [e.state for e in fresh.read(0).values()] == ["leased", "leased"]
    fresh.move(0, [0], "sealed")
    assert [e.state for e in Ledger(tmp_path).read(0).values()] == ["sealed", "leased"]


def test_a_ledger_file_written_whole_before_the_journal_reads_and_appends(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.path(0).parent.mkdir(parents=True)
    old = {"0": {"expiry": None, "leases": 1, "state": "scored", "trained": 0, "worker": "w"}}
    ledger.path(0).write_text(json.dumps(old, indent=2, sort_keys=True))
    assert ledger.read(0)[0].state == "scored"
    ledger.move(0, [0], "trained")
    assert Ledger(tmp_path).read(0)[0] == Entry(state="trained", worker="w", leases=1, trained=1)


def test_a_line_that_never_parses_is_a_corrupt_ledger(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.path(0).parent.mkdir(parents=True)
    ledger.path(0).write_text('{"0": {"state": "lea')
    with pytest.raises(StorageError, match=r"step-000001.json: no complete ledger state"):
        ledger.read(0)


def test_reads_parse_the_file_only_when_another_writer_changed_it(tmp_path, monkeypatch):
    parsed = []
    real = ledger_module.newest_record
    monkeypatch.setattr(ledger_module, "newest_record", lambda path: parsed.append(path) or real(path))
    ledger = Ledger(tmp_path)
    ledger.open(0, [0, 1])
    ledger.move(0, [0, 1], "leased", worker="w", ttl_s=60)
    ledger.advance(0, "leased", "sealed")
    assert ledger.in_state(0, "sealed") == [0, 1] and parsed == []  # its own writes are remembered
    Ledger(tmp_path).move(0, [0], "scored")  # another writer (a test's, or a process before a resume)
    assert ledger.in_state(0, "scored") == [0] and len(parsed) == 2  # the other's read, and this one's
