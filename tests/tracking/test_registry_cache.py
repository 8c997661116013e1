"""A registered model's local copy (.hindsight/registry) belongs to the store it came from: a second
tracking store in the same folder (a fresh mlflow.db after the first was moved aside) numbers its
versions from 1 again, and `models:/NAME@latest` there must resolve to its own weights, not to the
copy the first store's version 1 left behind."""
import json

from hindsight.config import PipelineConfig
from tracking.registry import resolve_model
from tracking.runs import start_run
from tracking.writes import register_version
from tracking.store import client


def _store_with_v1(tmp_path, label: str) -> PipelineConfig:
    uri = f"sqlite:///{tmp_path}/{label}.db"
    cfg = PipelineConfig.model_validate({"name": "mine", "run_dir": str(tmp_path / f"runs/{label}"),
                                         "tracking": {"tracking_uri": uri}})
    run = start_run(cfg, "sft", tags={"hindsight.model": "mine-sft"})
    model = tmp_path / f"model-{label}"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"trained_in": label}))
    assert register_version(client(cfg), run, model, "mine-sft", ()) == "1"
    return cfg


def test_version_1_of_two_stores_resolves_to_each_stores_own_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = _store_with_v1(tmp_path, "first")
    path, version = resolve_model(first, "models:/mine-sft@latest", "rl.init")
    assert version == "mine-sft/1" and json.loads(open(f"{path}/config.json").read()) == {"trained_in": "first"}
    second = _store_with_v1(tmp_path, "second")
    path2, version2 = resolve_model(second, "models:/mine-sft@latest", "rl.init")
    assert version2 == "mine-sft/1" and path2 != path
    assert json.loads(open(f"{path2}/config.json").read()) == {"trained_in": "second"}
    # and the first store's copy is still its own (reused, not downloaded again)
    assert resolve_model(first, "models:/mine-sft/1", "rl.init")[0] == path
