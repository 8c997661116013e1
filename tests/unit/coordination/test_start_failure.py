"""An RL run that fails to start after its learner group did (here: the scorers) closes what
started, so the stage's retry in the same process starts cleanly."""
import pytest
import torch.distributed as dist

from hindsight.config import PipelineConfig
from hindsight.coordination import run as run_module
from hindsight.coordination.run import RLRun


def test_a_failed_start_closes_the_learner_group(tiny_init, tmp_path, monkeypatch):
    work, init = tiny_init
    cfg = PipelineConfig.model_validate({
        "name": "start", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(work / "data"), "dvc_file": None, "prompts": str(work / "data/prompts.jsonl")},
        "rl": {"steps": 1, "prompts_per_step": 2, "samples_per_prompt": 2,
               "scoring": {"isolation": "inline", "rewards": [{"fn": "helpers:varied"}]}, "learner": {"strategy": "fsdp2"}}})

    def broken(*_a, **_k):
        assert dist.is_initialized()  # the sharded learner's group of one is up by now
        raise RuntimeError("the reward model does not fit")

    monkeypatch.setattr(run_module, "Scorers", broken)
    with pytest.raises(RuntimeError, match="the reward model does not fit"):
        RLRun(cfg, init, None)
    assert not dist.is_initialized()
    monkeypatch.undo()
    run = RLRun(cfg, init, None)  # the retry starts its own group
    try:
        assert dist.is_initialized() and run.learner.rank.strategy.name == "fsdp2"
    finally:
        run.close()
