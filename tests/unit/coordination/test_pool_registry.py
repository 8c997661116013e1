"""A worker pool is one file behind one contract (`coordination.pools.base.WorkerPool`),
registered in `hindsight.rollout.pools.POOLS`, and a pool chooses its weight transport: a test-only
pool (`reversed_pool.py`) with a test-only transport (`copy_transport.py`), registered from the
test, is taken by `rl.workers.placement` and trains what the in-process pool trains; its
capabilities, not a list of pairs, are what the config refuses."""
import pytest
import torch

from helpers import rl_cfg, tiny_init
from hindsight.rollout.pools import POOLS


@pytest.fixture
def reversed_pool():
    import reversed_pool

    POOLS["reversed"] = reversed_pool.ReversedPool  # again, if another test removed it
    reversed_pool.ReversedPool.shares = []
    yield reversed_pool.ReversedPool
    POOLS.remove("reversed")


def _trained(tmp_path, init, placement: str):
    from hindsight.coordination.run import RLRun

    cfg = rl_cfg(tmp_path / placement, steps=2, lr=1e-2, rollout={"max_new_tokens": 4, "groups_per_batch": 1},
                 workers={"placement": placement, "rollout": 2})
    run = RLRun(cfg, init, None)
    try:
        for step in range(2):
            run.rollout(step), run.score(step), run.update(step)
        sent = getattr(run.pool.sender, "versions", None)
        return [run.store.read("rollouts", s) for s in range(2)], run.policy.state_dict(), type(run.pool).__name__, sent
    finally:
        run.close()


def test_a_pool_registered_from_a_test_trains_what_the_in_process_pool_trains(reversed_pool, tmp_path):
    init = tiny_init(tmp_path)
    (tmp_path / "local").mkdir(), (tmp_path / "reversed").mkdir()
    for sub in ("local", "reversed"):
        (tmp_path / sub / "data").symlink_to(tmp_path / "data")
    local_rows, local_weights, local_pool, _ = _trained(tmp_path, init, "local")
    rows, weights, pool, run_sender_versions = _trained(tmp_path, init, "reversed")
    assert (local_pool, pool) == ("InProcessPool", "ReversedPool")
    assert rows == local_rows  # every group, token for token, whichever worker sampled it first
    assert all(torch.equal(weights[k], local_weights[k]) for k in local_weights)
    assert run_sender_versions == [1, 2]  # each version through the test-only transport, checked and acked
    assert reversed_pool.shares == [(0, ["reversed-1", "reversed-0"]), (1, ["reversed-1", "reversed-0"])]


def test_the_config_refuses_what_the_pool_cannot_do_and_names_the_pools(reversed_pool, tmp_path):
    with pytest.raises(ValueError, match="workers.placement: reversed samples with the last worker first; "
                                          "it does not combine with lora.enabled"):
        rl_cfg(tmp_path, workers={"placement": "reversed"}, lora={"enabled": True})
    with pytest.raises(ValueError, match="it does not combine with async.max_staleness >= 1"):
        rl_cfg(tmp_path, workers={"placement": "reversed"}, **{"async": {"max_staleness": 1}})
    with pytest.raises(ValueError, match="unknown worker pool 'nowhere'; registered: local, ray, reversed, subprocess"):
        rl_cfg(tmp_path, workers={"placement": "nowhere"})
    assert rl_cfg(tmp_path, workers={"placement": "reversed", "rollout": 3}).rl.workers.placement == "reversed"
