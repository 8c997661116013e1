"""`rl.lora` through the CLI: the registered policy loads from any directory with the lines in
docs/registry.md, merged into a plain model by default, or as an adapter whose base resolves."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.configs import rl_only, write

ROOT = Path(__file__).resolve().parents[2]


def documented_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / "docs/registry.md").read_text(), re.S)


def _run_rl(tmp_path, init, work, register: str):
    lora = {"enabled": True, "r": 4, "alpha": 8, "registered": register}
    write(tmp_path / "rl.yaml", rl_only("lora", work / "data", init, lora=lora))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "cli", "run", "rl", "-c", "rl.yaml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return uri, MlflowClient(uri, registry_uri=uri)


def _load_elsewhere(tmp_path, uri: str, snippet: str) -> str:
    """The documented lines, in a fresh interpreter whose working directory is not the run's."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    code = (snippet.replace("sqlite:///mlflow.db", uri).replace("demo-policy", "lora-policy")
            + textwrap.dedent("""
            import torch
            out = model.generate(input_ids=torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False)
            print("generated", out.shape[1] - 3, type(model).__name__)
            """))
    res = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": ""})
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def test_a_lora_policy_is_registered_merged_and_loads_with_transformers_from_anywhere(tiny_init, tmp_path):
    work, init = tiny_init
    uri, client = _run_rl(tmp_path, init, work, "merged")
    mv = client.get_model_version_by_alias("lora-policy", "latest")
    assert mv.tags["hindsight.adapter"] == "lora r=4 alpha=8" and mv.tags["hindsight.lora_registered"] == "merged"
    files = {f.path for f in client.list_artifacts(mv.run_id, "checkpoint")}
    assert "checkpoint/model.safetensors" in files and "checkpoint/adapter_config.json" not in files
    assert {"checkpoint/config.json", "checkpoint/generation_config.json", "checkpoint/tokenizer.json"} <= files
    out = _load_elsewhere(tmp_path, uri, documented_snippets()[0])
    assert "generated" in out and "LlamaForCausalLM" in out


@pytest.mark.parametrize("register", ["adapter"])
def test_an_adapter_names_a_base_that_resolves_and_loads_with_peft_from_anywhere(tiny_init, tmp_path, register):
    work, init = tiny_init
    uri, client = _run_rl(tmp_path, init, work, register)
    mv = client.get_model_version_by_alias("lora-policy", "latest")
    files = {f.path for f in client.list_artifacts(mv.run_id, "checkpoint")}
    assert "checkpoint/adapter_config.json" in files and "checkpoint/model.safetensors" not in files
    assert mv.tags["hindsight.base_model"] == str(Path(init).resolve())  # absolute: it resolves from anywhere
    out = _load_elsewhere(tmp_path, uri, documented_snippets()[1])
    assert "generated" in out and "LlamaForCausalLM" in out
