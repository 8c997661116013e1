"""The chain on a model in a user's format (a tiny Qwen2ForCausalLM with a Qwen2Tokenizer and a
ChatML template, in Hugging Face format) with the learner in mini- and micro-batches under
activation checkpointing: sft -> rl -> registry, through the real CLI, Prefect and MLflow; in one
process, and as an FSDP2 learner group of 2 (each rank a shard of the policy)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]
FSDP2 = ["--set", "rl.workers.placement=ray", "--set", "rl.learner.processes=2", "--set",
         "rl.learner.strategy=fsdp2"]


@pytest.mark.parametrize("learner", [[], FSDP2], ids=["one-process", "fsdp2-group-of-2"])
def test_sft_rl_and_the_registry_on_a_qwen2_model_with_micro_batches(tmp_path, learner):
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": str(ROOT),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    res = subprocess.run([sys.executable, "-m", "cli", "run", "pipeline", "-c", str(ROOT / "configs/smoke-qwen2.yaml"),
                          *learner], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    client = MlflowClient(env["MLFLOW_TRACKING_URI"], registry_uri=env["MLFLOW_TRACKING_URI"])
    policy = client.get_model_version_by_alias("smoke-qwen2-policy", "latest")
    rl = client.get_run(policy.run_id)
    history = {k: [m.value for m in client.get_metric_history(rl.info.run_id, k)]
               for k in ("runtime/learn/mini_batches", "runtime/learn/micro_batches", "runtime/learn/padding_fraction",
                         "policy/loss")}
    assert history["runtime/learn/mini_batches"] == [2.0, 2.0]            # 16 samples, 8 per optimizer step
    assert min(history["runtime/learn/micro_batches"]) > 1                # each mini-batch in several micro-batches
    assert len(history["policy/loss"]) == 2
    assert client.get_model_version_by_alias("smoke-qwen2-sft", "latest")

    # the registered policy is a Qwen2 model with its ChatML tokenizer, loadable by transformers as it is
    from transformers import AutoModelForCausalLM, AutoTokenizer

    local = client.download_artifacts(policy.run_id, "checkpoint", str(tmp_path / "dl"))
    model, tok = AutoModelForCausalLM.from_pretrained(local), AutoTokenizer.from_pretrained(local)
    assert type(model).__name__ == "Qwen2ForCausalLM" and type(tok).__name__ == "Qwen2Tokenizer"
    chat = tok.apply_chat_template([{"role": "user", "content": "Ann has 40 pens"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat.startswith("<|im_start|>user\n") and chat.endswith("<|im_start|>assistant\n")
    assert (Path(local) / "generation_config.json").is_file() and tok.chat_template
    ids = tok(chat, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids.shape[1]  # it generates as it is
    if learner:  # trained sharded: the weights came to the rollout copy in buckets, resume state in DCP shards
        assert client.get_metric_history(rl.info.run_id, "runtime/publish/buckets")
        state = tmp_path / "runs/smoke-qwen2/rl/checkpoints/learner_state/step-000002"
        assert {p.name for p in state.iterdir()} == {".metadata", "__0_0.distcp", "__1_0.distcp"}
