"""A sharded rank starts on the meta device and reads only its own slices of the safetensors:
at P = 1 and P = 2 (gloo, a process each) the logits equal `from_pretrained`'s bit for bit, tied
weights stay tied, and a critic's new head starts with the values a replicated build gives it.
The memory it saves is bench/sharded_start.py's to measure (`ratio start_rss fsdp2 P2/P1`)."""
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))


@pytest.mark.parametrize("world", [1, 2])
def test_a_meta_started_rank_computes_what_from_pretrained_computes(tmp_path, world):
    import sharded_start

    path = sharded_start.save_model(tmp_path / "model", hidden=64, layers=2, vocab=515)  # rows not divisible by 2
    ranks = sharded_start.group(path, world, "meta", 515)
    assert [r["rank"] for r in ranks] == list(range(world))
    assert all(r["bit_equal"] and r["tied"] for r in ranks), ranks


def test_a_critic_head_starts_the_same_on_the_meta_device(tmp_path):
    import torch
    import torch.distributed as dist

    from hindsight.config import PipelineConfig
    from hindsight.learning.build import build_critic
    from hindsight.learning.strategies.sharded import Sharded
    from hindsight.models.tiny import build_tiny_qwen2

    path = str(build_tiny_qwen2(tmp_path / "q", hidden=32, layers=2, heads=4, kv_heads=2))
    cfg = PipelineConfig.model_validate({"rl": {"learner": {"strategy": "fsdp2"}}})
    full = build_critic(path, cfg.model, cfg.rl, pad_id=0, seed=3)
    strategy = Sharded(0, 1, cfg.rl.learner)
    strategy.join(None, 60)
    try:
        meta = strategy.build(lambda p, empty=False: build_critic(p, cfg.model, cfg.rl, 0, 3, empty=empty), path)
        got = strategy.full_state(meta, "critic")
        want = full.state_dict()
        assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
        assert not torch.equal(want["score.weight"], torch.zeros_like(want["score.weight"]))  # a real, seeded head
    finally:
        strategy.leave()
    assert not dist.is_initialized()
