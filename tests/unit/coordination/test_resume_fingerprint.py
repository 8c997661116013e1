"""A first attempt that failed before its first sample leaves a fingerprint but nothing to
resume: the next run with other settings starts fresh (no "settings changed" resume, nothing
moved aside), while a folder that holds samples still compares its settings."""
import json

from hindsight.coordination.resume import prepare_resume
from hindsight.state.rundir import RLDir


def _fp(reward: str, lr: float) -> dict:
    return {"sampling": {"temperature": 1.0}, "algorithm": {"name": "grpo"},
            "scoring": {"rewards": [{"fn": reward}]}, "training": {"lr": lr}}


def test_a_failed_first_attempt_is_not_a_changed_settings_resume(tmp_path):
    paths = RLDir(tmp_path / "rl")
    paths.path.mkdir()
    paths.fingerprint.write_text(json.dumps(_fp("rewards.a:old", 1e-3)))
    changes = prepare_resume(paths, _fp("rewards.b:new", 1e-4), 0, 4)
    assert changes.by_section == {}
    assert json.loads(paths.fingerprint.read_text()) == _fp("rewards.b:new", 1e-4)
    assert not paths.resume_changes.exists() and not paths.rescored.exists()


def test_a_folder_with_samples_still_compares_its_settings(tmp_path):
    paths = RLDir(tmp_path / "rl")
    (paths.path / "rollouts").mkdir(parents=True)
    (paths.path / "rollouts" / "step-000001.parquet").write_bytes(b"x")
    paths.fingerprint.write_text(json.dumps(_fp("rewards.a:old", 1e-3)))
    changes = prepare_resume(paths, _fp("rewards.a:old", 1e-4), 0, 4)
    assert changes.keys("training") and not changes.keys("scoring")
    assert paths.resume_changes.exists()


def test_a_folder_whose_step_files_were_numbered_from_0_is_refused(tmp_path):
    """Read with today's numbering, its step-000001 would be taken for the first step's samples
    when it holds the second's: a resume would train on the wrong step."""
    import pytest

    from hindsight.errors import CheckpointError
    from hindsight.state.store import RolloutStore

    paths = RLDir(tmp_path / "rl")
    (paths.path / "rollouts").mkdir(parents=True)
    (paths.path / "rollouts" / "step-000000.parquet").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"numbered step files from 0 .*step-000000.parquet.*--force"):
        prepare_resume(paths, _fp("rewards.a:old", 1e-3), 0, 4)
    store = RolloutStore(tmp_path / "new")
    store.write("rollouts", 0, [{"step": 0}])
    assert store.path("rollouts", 0).name == "step-000001.parquet" and store.steps("rollouts") == [0]
