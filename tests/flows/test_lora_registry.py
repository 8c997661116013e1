"""`rl.lora` through the CLI: the registered policy is the adapter folder, its version records
the adapter and its base, and it loads (merged on its base) from the registry."""
import os
import subprocess
import sys
from pathlib import Path

import torch
from mlflow.tracking import MlflowClient

from tests.configs import rl_only, write

ROOT = Path(__file__).resolve().parents[2]


def test_a_lora_policy_is_registered_as_its_adapter_with_the_base_recorded(tiny_init, tmp_path, monkeypatch):
    work, init = tiny_init
    write(tmp_path / "rl.yaml", rl_only("lora", work / "data", init, lora={"enabled": True, "r": 4, "alpha": 8}))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "cli", "run", "rl", "-c", "rl.yaml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    client = MlflowClient(uri, registry_uri=uri)
    mv = client.get_model_version_by_alias("lora-policy", "latest")
    assert mv.tags["hindsight.adapter"] == "lora r=4 alpha=8" and mv.tags["hindsight.base_model"] == init
    files = {f.path for f in client.list_artifacts(mv.run_id, "checkpoint")}
    assert "checkpoint/adapter_config.json" in files and "checkpoint/model.safetensors" not in files

    from hindsight.models.load import load_causal_lm
    from tracking import resolve_model
    from hindsight.config import PipelineConfig

    cfg = PipelineConfig.model_validate({"tracking": {"tracking_uri": uri}})
    monkeypatch.chdir(tmp_path)  # the registry cache (.hindsight/registry) is relative
    local, version = resolve_model(cfg, "models:/lora-policy@latest", "rl.init")
    model = load_causal_lm(local)  # the adapter on its base, merged: a plain model
    assert version == "lora-policy/1" and not hasattr(model, "disable_adapter")
    assert torch.isfinite(model(input_ids=torch.tensor([[1, 2, 3]])).logits).all()
