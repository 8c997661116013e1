"""Checksums on everything stored: a flipped bit in a shard is found and the shard generated
again from its seed (training ends where a clean run ends); a flipped bit in a checkpoint
falls back to the newest intact version; with none intact, one clear error."""
import logging

import pytest
import torch

from hindsight.errors import CheckpointError
from hindsight.coordination.run import RLRun
from hindsight.state.store import CorruptShard, RolloutStore
from helpers import rl_cfg, tiny_init


def _flip(path, at=0.5):
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def _steps(run, steps):
    for step in steps:
        run.rollout(step), run.score(step)
        run.update(step)


def _weights(run):
    return {k: v.clone() for k, v in run.policy.state_dict().items()}


def test_a_flipped_bit_in_a_stored_shard_fails_its_read(tmp_path):
    store = RolloutStore(tmp_path)
    store.write("scores", 0, [{"group": 0, "reward": 0.0}] * 64)
    _flip(store.path("scores", 0))
    with pytest.raises(CorruptShard, match=r"scores/step-000001.parquet: sha256 .* does not match"):
        RolloutStore(tmp_path).read("scores", 0)
    assert RolloutStore(tmp_path).check("scores", 0) is False
    assert not store.path("scores", 0).exists() and len(list((tmp_path / "corrupt" / "scores").iterdir())) == 2


@pytest.mark.parametrize("component", ["scores", "rollouts"])
def test_a_corrupt_shard_is_generated_again_and_training_ends_where_a_clean_run_ends(tmp_path, component, caplog):
    init = tiny_init(tmp_path / "hurt")
    tiny_init(tmp_path / "clean")  # the same demo data for the clean run (its own model is not used)
    clean = RLRun(rl_cfg(tmp_path / "clean", steps=3, save_every=1), init, None)
    _steps(clean, range(3))
    want = _weights(clean)
    clean.close()

    cfg = rl_cfg(tmp_path / "hurt", steps=3, save_every=1)
    run = RLRun(cfg, init, None)
    _steps(run, [0])
    run.rollout(1), run.score(1)  # stored and scored, then the process dies before training it
    run.close()
    _flip(run.store.path(component, 1))
    with caplog.at_level(logging.WARNING, logger="hindsight.state.store"):
        resumed = RLRun(cfg, init, None)
        assert resumed.start_step == 1
        _, rollout = resumed.rollout(1)
        _, score = resumed.score(1)
    assert "does not match" in caplog.text and "generated again from its seed" in caplog.text
    assert score["store/regenerated_shards"] == 1.0 and "rollout/reused" not in rollout if component == "rollouts" \
        else rollout == {"rollout/reused": 1.0}
    resumed.update(1)
    _steps(resumed, [2])
    got = _weights(resumed)
    resumed.close()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("victim", ["policy/step-000002/model.safetensors", "optimizer/step-000002.pt"])
def test_a_flipped_bit_in_a_checkpoint_falls_back_to_the_newest_intact_version(tmp_path, victim, caplog):
    init = tiny_init(tmp_path)
    cfg = rl_cfg(tmp_path, steps=3, save_every=1)
    run = RLRun(cfg, init, None)
    _steps(run, [0])
    at_one = _weights(run)
    _steps(run, [1])
    run.close()
    _flip(run.ckpt.root / victim)
    with caplog.at_level(logging.WARNING, logger="hindsight.state.checkpoint"):
        resumed = RLRun(cfg, init, None)
    assert resumed.start_step == 1
    assert f"checkpoint step 2 is corrupt ({victim}" in caplog.text and "resuming from step 1" in caplog.text
    assert (run.ckpt.root / "corrupt").exists() and resumed.ckpt.latest_step() == 1
    for name, value in _weights(resumed).items():
        assert torch.equal(value, at_one[name])
    _steps(resumed, [1, 2])  # and it trains on from there
    resumed.close()


def test_with_no_intact_checkpoint_the_resume_is_one_clear_error(tmp_path):
    init = tiny_init(tmp_path)
    cfg = rl_cfg(tmp_path, steps=3, save_every=1)
    run = RLRun(cfg, init, None)
    _steps(run, [0, 1])
    run.close()
    for step in (1, 2):
        _flip(run.ckpt.root / f"optimizer/step-{step:06d}.pt")
    want = r"no intact checkpoint version \(step 2: optimizer/step-000002.pt; step 1: optimizer/step-000001.pt fail"
    with pytest.raises(CheckpointError, match=want + r" their sha256\); rerun with --force"):
        RLRun(cfg, init, None)
