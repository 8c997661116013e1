import pytest
import torch

from hindsight.state.checkpoint import CheckpointManager, checkpoint_due, checkpoint_spans
from hindsight.errors import CheckpointError, StorageError
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.tiny import build_tiny_model
from hindsight.coordination.prompts import prompt_indices
from hindsight.state.store import RolloutStore


def test_store_round_trip_and_step_listing(tmp_path):
    store = RolloutStore(tmp_path)
    store.write("rollouts", 3, [{"a": 1, "ids": [1, 2]}])
    store.write("rollouts", 1, [{"a": 2, "ids": []}])
    (tmp_path / "rollouts" / ".step-000002.parquet.tmp-1").write_bytes(b"half")  # a torn write
    assert store.steps("rollouts") == [1, 3]
    assert store.read("rollouts", 3) == [{"a": 1, "ids": [1, 2]}]
    assert not store.has("scores", 3)


def test_checkpoint_versions_retention_and_corruption(tmp_path):
    path = build_tiny_model(tmp_path / "m", hidden=32, layers=1, heads=2)
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    ck = CheckpointManager(tmp_path / "ck", keep_last=2)
    for step in (2, 4, 6):
        ck.save(step, model, tok, opt)
    assert ck.latest_step() == 6
    assert sorted(p.name for p in (tmp_path / "ck" / "policy").iterdir()) == ["step-000004", "step-000006"]
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ck.load_optimizer(6, opt2)
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    (tmp_path / "ck" / "optimizer" / "step-000006.pt").write_bytes(b"truncated")
    try:
        ck.load_optimizer(6, opt2)
        raise AssertionError("corrupt checkpoint loaded")
    except CheckpointError as exc:
        assert "step-000006.pt: corrupt or truncated checkpoint" in str(exc)


@pytest.mark.parametrize("start, steps, every, spans", [
    (0, 4, 2, [(0, 2), (2, 4)]),
    (3, 10, 4, [(3, 4), (4, 8), (8, 10)]),  # a resume mid-interval ends its first span at the next checkpoint
    (0, 30, 10_000, [(0, 30)]),  # the last step always checkpoints
    (5, 12, 5, [(5, 10), (10, 12)]),
    (0, 1, 1, [(0, 1)]),
    (10, 10, 5, []),  # nothing left to train
])
def test_a_span_of_steps_ends_where_the_update_writes_a_checkpoint(start, steps, every, spans):
    assert checkpoint_spans(start, steps, every) == spans
    # the contract with RLRun.update: each span ends at a checkpoint, and none falls inside one
    assert all(checkpoint_due(last, steps, every) for _, last in spans)
    assert not any(checkpoint_due(done, steps, every) for first, last in spans for done in range(first + 1, last))


def test_a_failed_step_follow_up_is_not_retried_in_place_and_a_done_one_moves_the_retry_on():
    from types import SimpleNamespace

    from hindsight.coordination.run import RLRun

    run = SimpleNamespace(updating=False, next_step=3)
    with pytest.raises(RuntimeError):
        with RLRun.recording(run, 3):
            assert run.updating  # the flow's retry condition reads this
            raise RuntimeError("the evaluation failed")
    assert (run.updating, run.next_step) == (True, 3)  # no retry in place; the stage's retry resumes
    run.updating = False
    with RLRun.recording(run, 3):
        pass
    assert (run.updating, run.next_step) == (False, 4)  # a retry of the interval starts after step 3


def test_prompt_cursor_is_a_pure_function_of_step():
    a = [prompt_indices(10, 4, s, seed=0) for s in range(5)]
    assert a == [prompt_indices(10, 4, s, seed=0) for s in range(5)]
    first_epoch = sorted(i for s in range(2) for i in a[s]) + sorted(a[2][:2])
    assert sorted(first_epoch) == list(range(10))  # every prompt once per epoch


def test_force_new_run_moves_the_old_state_aside(tmp_path):
    from hindsight.state.rundir import RunDir

    run = RunDir(tmp_path / "run").claim()
    run.record("rl").mkdir()
    (run.root / "rl" / "keep.txt").write_text("old state")
    moved = run.move_aside("rl")
    assert not (run.root / "rl").exists() and (moved / "keep.txt").read_text() == "old state"


@pytest.mark.parametrize("keep", [1, 3])
def test_retention_keeps_the_configured_number_of_complete_versions(tmp_path, keep):
    path = build_tiny_model(tmp_path / "m", hidden=32, layers=1, heads=2)
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ck = CheckpointManager(tmp_path / "ck", keep_last=keep)
    for step in (1, 2, 3, 4):
        ck.save(step, model, tok, opt)
    kept = [4, 3, 2][:keep]
    assert sorted(p.name for p in (tmp_path / "ck" / "policy").iterdir()) == [f"step-{s:06d}" for s in sorted(kept)]
    assert sorted(p.name for p in (tmp_path / "ck" / "optimizer").iterdir()) == [f"step-{s:06d}.pt" for s in sorted(kept)]


def test_disk_full_mid_checkpoint_keeps_the_previous_version(tmp_path, monkeypatch):
    path = build_tiny_model(tmp_path / "m", hidden=32, layers=1, heads=2)
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ck = CheckpointManager(tmp_path / "ck", keep_last=2)
    ck.save(2, model, tok, opt)
    monkeypatch.setenv("HINDSIGHT_FAULT", "disk_full:optimizer/step-000004")
    monkeypatch.setenv("HINDSIGHT_NO_SPACE_WAIT_S", "0.5")  # a full disk that outlasts the wait
    with pytest.raises(StorageError, match=r"optimizer/step-000004.pt: write failed \(disk full, still after 0.5 s\)"):
        ck.save(4, model, tok, opt)
    assert ck.latest_step() == 2  # the manifest never moved to the torn version
    assert not [p for p in (tmp_path / "ck").rglob(".*tmp*")], "a temporary file survived"
    monkeypatch.delenv("HINDSIGHT_FAULT")
    ck.save(4, model, tok, opt)  # space is back: the same save now completes
    assert ck.latest_step() == 4


def test_a_column_reads_the_same_values_as_the_rows(tmp_path):
    from hindsight.state.store import RolloutStore

    rows = [{"group": g, "weights_version": g % 3, "completion_ids": list(range(g))} for g in range(7)]
    RolloutStore(tmp_path).write("rollouts", 4, rows)
    fresh = RolloutStore(tmp_path)  # nothing cached: read from the file
    assert fresh.column("rollouts", 4, "weights_version") == [r["weights_version"] for r in rows]
    assert fresh.read("rollouts", 4) == rows


def test_a_sharded_learner_state_is_one_component_with_its_checksums(tmp_path):
    """The folder a sharded learner writes (one file per rank) is kept, checksummed, retained and
    set aside like every component; without optimizer files of its own."""
    path = build_tiny_model(tmp_path / "m", hidden=32, layers=1, heads=2)
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    ck = CheckpointManager(tmp_path / "ck", keep_last=2)

    def shards(step):
        def write(folder):
            for rank in (0, 1):
                (folder / f"__{rank}_0.distcp").write_bytes(bytes([step, rank]) * 64)
            (folder / ".metadata").write_bytes(b"meta")
        return write

    for step in (2, 4, 6):
        ck.save(step, model, tok, extra={}, state_writer=shards(step))
    root = tmp_path / "ck"
    assert sorted(p.name for p in (root / "learner_state").iterdir()) == ["step-000004", "step-000006"]
    assert not (root / "optimizer").exists()
    assert ck.manifest()["learner_state"] == 6 and "learner_state/step-000006/__1_0.distcp" in ck.manifest()["versions"]["6"]
    shard = root / "learner_state/step-000006/__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[3] ^= 1
    shard.write_bytes(bytes(data))
    assert ck.intact_step() == 4  # the flipped bit is caught; the newest intact version is used
    assert ck.manifest()["learner_state"] == 4 and not (root / "learner_state/step-000006").exists()
    assert list((root / "corrupt").rglob("__1_0.distcp"))


def test_merging_parts_clears_a_killed_writers_temporary_file_and_keeps_a_live_ones(tmp_path):
    """A SIGKILL mid-write leaves `.NAME.tmp-PID` among a step's parts; the rerun samples those
    groups again and merges the step, which must not fail on the dead writer's leftover."""
    import os
    import subprocess

    from hindsight.fsutil import remove_dead_temporaries

    store = RolloutStore(tmp_path)
    for g in range(2):
        store.write_part("scores", 7, g, [{"group": g, "reward": float(g)}])
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer runs
    folder = tmp_path / "parts" / "scores" / "step-000008"
    assert folder.is_dir()
    (folder / f".batch-00000-00001.parquet.tmp-{dead.pid}").write_bytes(b"torn")
    store.merge_parts("scores", 7, [0, 1])
    assert not folder.exists() and [r["reward"] for r in store.read("scores", 7)] == [0.0, 1.0]
    live = tmp_path / "other"
    live.mkdir()
    (live / f".x.parquet.tmp-{os.getpid()}").write_bytes(b"being written")
    remove_dead_temporaries(live)
    assert (live / f".x.parquet.tmp-{os.getpid()}").exists()


def test_a_short_disk_full_is_waited_out_and_the_save_completes(tmp_path, monkeypatch, caplog):
    """A disk full for a second: every write of the save waits for space and retries, so the save
    completes, whole, after it; the wait is said once a write, with its limit."""
    import threading
    import time

    path = build_tiny_model(tmp_path / "m", hidden=32, layers=1, heads=2)
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ck = CheckpointManager(tmp_path / "ck", keep_last=2)
    full = tmp_path / "full"
    full.touch()
    monkeypatch.setenv("HINDSIGHT_FAULT", f"disk_full_while:{full}")
    threading.Timer(1.0, full.unlink).start()
    t0 = time.monotonic()
    with caplog.at_level("WARNING", logger="hindsight.fsutil"):
        ck.save(2, model, tok, opt)
    assert time.monotonic() - t0 >= 1.0 and ck.latest_step() == 2
    assert not [p for p in (tmp_path / "ck").rglob(".*tmp*")], "a temporary file survived"
    waits = [r.getMessage() for r in caplog.records]
    assert waits and all("disk full; waiting up to 60 s for space (HINDSIGHT_NO_SPACE_WAIT_S)" in m for m in waits)
    fresh = CheckpointManager(tmp_path / "ck", keep_last=2)  # what a resume reads back: intact, the same weights
    assert fresh.intact_step() == 2
    saved = load_causal_lm(str(fresh.policy_dir(2)))
    for (k, a), (_, b) in zip(model.state_dict().items(), saved.state_dict().items()):
        assert torch.equal(a, b), k
