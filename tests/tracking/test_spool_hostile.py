"""`hindsight sync` replays a spool, never obeys it: a hand-edited `ops.jsonl` cannot upload a file
from outside the run directory, register a folder (or a model) its run never could, write to
another run directory's run, or open a store of its choosing; a malformed line is one error; and a
registration replayed after a kill mid-sync gives one version, not two."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hindsight.config import PipelineConfig
from hindsight.state.rundir import RunDir
from tracking.runs import start_run
from tracking.spool import Spool
from tracking.writes import SpoolError, register_version, sync_spool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mine = PipelineConfig.model_validate({"name": "mine", "run_dir": str(tmp_path / "runs/mine"),
                                          "tracking": {"tracking_uri": uri}})
    other = PipelineConfig.model_validate({"name": "other", "run_dir": str(tmp_path / "runs/other"),
                                           "tracking": {"tracking_uri": uri}})
    run = start_run(mine, "sft", tags={"hindsight.model": "mine-sft"})
    victim = start_run(other, "rl", tags={"hindsight.model": "other-policy"})
    RunDir.of(mine).record("sft")  # as a run that trained there would have: the folder is hindsight's
    (tmp_path / "runs/mine/model").mkdir(parents=True)
    (tmp_path / "runs/mine/model/config.json").write_text("{}")
    return tmp_path, uri, mine, run, victim


def _spool(cfg, *ops):
    spool = Spool(cfg.root)
    spool.dir.mkdir(parents=True, exist_ok=True)
    spool.ops.write_text("".join((op if isinstance(op, str) else json.dumps(op)) + "\n" for op in ops))
    return spool


@pytest.mark.parametrize("attack, refusal", [
    ({"op": "artifact", "path": "/etc/shadow"}, "path /etc/shadow is outside the run directory"),
    ({"op": "register", "local_dir": "/usr/lib", "model_name": "mine-sft", "aliases": []}, "is outside the run directory"),
    ({"op": "register", "local_dir": "RUN/model", "model_name": "other-policy", "aliases": []},
     "registers 'mine-sft', not 'other-policy'"),
    ({"op": "terminate", "status": "FAILED", "run_id": "VICTIM"}, "was not started by"),
    ({"op": "tags", "tags": {"x": "1"}, "run_id": "no-such-run"}, "is not in the store"),
    ({"op": "shell", "cmd": "id"}, "not a spooled operation"),
    ({"op": "metrics", "metrics": "many"}, "lacks or mistypes ['metrics']"),
])
def test_a_crafted_operation_is_refused_with_its_line(store, attack, refusal):
    tmp, uri, mine, run, victim = store
    op = {"uri": uri, "run_id": run, **attack}
    op["run_id"] = {"VICTIM": victim}.get(op["run_id"], op["run_id"])
    if op.get("local_dir") == "RUN/model":
        op["local_dir"] = str(mine.root / "model")
    spool = _spool(mine, {"op": "tags", "uri": uri, "run_id": run, "tags": {"fine": "1"}}, op)
    with pytest.raises(SpoolError, match=f"{spool.ops}:2: .*" + refusal.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        sync_spool(mine.root, uri)
    client = MlflowClient(uri)
    assert client.get_run(run).data.tags["fine"] == "1"  # the line before went out, once
    assert client.get_run(victim).info.status == "RUNNING"
    assert not client.search_registered_models()
    assert (json.loads((spool.dir / "done.json").read_text())["count"]) == 1  # a fixed spool resumes at line 2


def test_a_malformed_line_is_one_error_naming_it_and_a_torn_last_line_is_skipped(store):
    tmp, uri, mine, run, _ = store
    spool = _spool(mine, '{"op": "tags", "uri"', {"op": "tags", "uri": uri, "run_id": run, "tags": {"a": "1"}})
    with pytest.raises(SpoolError, match=f"{spool.ops}:1: not a spooled operation"):
        sync_spool(mine.root, uri)
    spool = _spool(mine, {"op": "tags", "uri": uri, "run_id": run, "tags": {"a": "1"}}, '{"op": "ta')
    (spool.dir / "done.json").unlink(missing_ok=True)
    assert sync_spool(mine.root, uri) == 1


def test_the_store_is_the_configured_one_never_the_spools(store):
    tmp, uri, mine, run, _ = store
    elsewhere = tmp / "elsewhere" / "evil.db"
    _spool(mine, {"op": "tags", "uri": f"sqlite:///{elsewhere}", "run_id": run, "tags": {"a": "1"}})
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri}
    res = subprocess.run([sys.executable, "-m", "cli", "sync", str(mine.root)], cwd=tmp, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and f"spooled for sqlite:///{elsewhere}, but this sync would send to {uri}" in res.stderr
    assert not elsewhere.exists() and not elsewhere.parent.exists()


def test_a_registration_replayed_after_a_kill_gives_one_version(store):
    tmp, uri, mine, run, _ = store
    client = MlflowClient(uri, registry_uri=uri)
    first = register_version(client, run, mine.root / "model", "mine-sft", ())
    again = register_version(client, run, mine.root / "model", "mine-sft", ())  # done.json never saw the first
    assert first == again == "1" and len(client.search_model_versions("name='mine-sft'")) == 1


# --- round four: a spool registers only what its run made ----------------------------------
def _register(cfg, uri, run, **over):
    from tracking.writes import file_checksums

    folder = cfg.root / "model"
    return {"op": "register", "uri": uri, "run_id": run, "local_dir": str(folder), "model_name": "mine-sft",
            "aliases": [], "files": file_checksums(folder), **over}


def test_a_spool_never_sets_a_hindsight_tag_so_a_forged_model_name_registers_nothing(store, caplog):
    tmp, uri, mine, run, _ = store
    forged = {"op": "tags", "uri": uri, "run_id": run,
              "tags": {"hindsight.model": "base-sft", "hindsight.run_dir": str(tmp / "runs/other"), "note": "kept"}}
    spool = _spool(mine, forged, _register(mine, uri, run, model_name="base-sft"))
    with pytest.raises(SpoolError, match=f"{spool.ops}:2: .*registers 'mine-sft', not 'base-sft'"):
        sync_spool(mine.root, uri)
    tags = MlflowClient(uri).get_run(run).data.tags
    assert tags["hindsight.model"] == "mine-sft" and tags["hindsight.run_dir"] == str(mine.root.resolve())
    assert tags["note"] == "kept" and "left out: hindsight.model, hindsight.run_dir" in caplog.text
    assert not MlflowClient(uri, registry_uri=uri).search_registered_models()


def test_a_registration_replays_only_the_folder_the_run_wrote(store):
    tmp, uri, mine, run, _ = store
    op = _register(mine, uri, run)
    (mine.root / "model" / "config.json").write_text('{"forged": true}')  # after the run spooled it
    spool = _spool(mine, op)
    with pytest.raises(SpoolError, match=f"{spool.ops}:1: .*is not the folder the run registered \\(config.json"):
        sync_spool(mine.root, uri)
    spool = _spool(mine, {k: v for k, v in _register(mine, uri, run).items() if k != "files"})
    with pytest.raises(SpoolError, match="records no checksums"):
        sync_spool(mine.root, uri)
    (spool.dir / "done.json").unlink(missing_ok=True)
    _spool(mine, _register(mine, uri, run))  # the folder as it is now, recorded as it is now: fine
    assert sync_spool(mine.root, uri) == 1
    assert MlflowClient(uri, registry_uri=uri).get_model_version("mine-sft", "1")


def test_a_symlink_at_any_level_is_refused_and_nothing_outside_is_uploaded(store):
    tmp, uri, mine, run, _ = store
    secret = tmp / "outside-secret.txt"
    secret.write_text("s3cret")
    nested = mine.root / "reports" / "deep"
    nested.mkdir(parents=True)
    (nested / "leak.txt").symlink_to(secret)
    spool = _spool(mine, {"op": "artifact", "uri": uri, "run_id": run, "path": str(mine.root / "reports")})
    with pytest.raises(SpoolError, match=f"{spool.ops}:1: path .*leak.txt is a symlink; refused"):
        sync_spool(mine.root, uri)
    (mine.root / "linked").symlink_to(mine.root / "model")
    spool = _spool(mine, _register(mine, uri, run, local_dir=str(mine.root / "linked")))
    with pytest.raises(SpoolError, match="linked is a symlink; refused"):
        sync_spool(mine.root, uri)
    assert not list(Path(tmp).rglob("mlartifacts/**/leak.txt"))


def test_mlflow_refusing_a_replayed_write_is_one_error_line(store):
    tmp, uri, mine, run, _ = store
    MlflowClient(uri).log_param(run, "lr", "0.1")
    _spool(mine, {"op": "params", "uri": uri, "run_id": run, "params": {"lr": "0.5"}})  # MLflow never changes a param
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri}
    res = subprocess.run([sys.executable, "-m", "cli", "sync", str(mine.root)], cwd=tmp, env=env,
                         capture_output=True, text=True, timeout=120)
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert res.returncode == 1 and len(errors) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "ops.jsonl:1: MLflow refused the spooled 'params'" in errors[0]
