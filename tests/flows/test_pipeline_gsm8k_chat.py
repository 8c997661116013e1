"""A user's own model and data, end to end through the CLI, Prefect and MLflow: a tiny
Qwen2ForCausalLM in Hugging Face format with a ChatML template, GSM8K-format JSONL (`question`,
`answer` ending in `#### N`) whose plain-text questions are wrapped as user turns after a system
prompt, SFT on `messages` data, and a LoRA policy registered as an adapter on the registered SFT
model. The rollouts are conversational, RL and evaluation stop at `<|im_end|>`, and the version
comparison (which used to crash on chat prompts) writes its report."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import yaml
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "Answer with #### and the number."


def _problem(rng):
    a, b = rng.randrange(1, 9), rng.randrange(1, 9)
    return f"Ann has {a} pens and gets {b} more. How many pens now?", a + b


def _write_data(folder: Path) -> None:
    rng = random.Random(0)
    folder.mkdir()
    for name, n in (("train", 64), ("test", 16)):
        rows = [dict(zip(("question", "n"), _problem(rng))) for _ in range(n)]
        (folder / f"gsm8k-{name}.jsonl").write_text("".join(json.dumps(
            {"question": r["question"], "answer": f"{r['n']} pens.\n#### {r['n']}"}) + "\n" for r in rows))
    sft = []
    for _ in range(256):
        q, n = _problem(rng)
        sft.append({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q},
                                 {"role": "assistant", "content": f"#### {n}"}]})
    (folder / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sft))


def test_qwen2_chatml_on_gsm8k_format_data_end_to_end(tmp_path):
    data = tmp_path / "mydata"
    _write_data(data)
    per_file = {"question": "prompt"}
    cfg = {"name": "gsm-chat", "seed": 0, "model": {"base": "tiny://qwen2"},
           "data": {"dir": str(data), "dvc_file": None, "build_demo": False, "prompts": str(data / "gsm8k-train.jsonl"),
                    "eval": str(data / "gsm8k-test.jsonl"), "sft": str(data / "sft.jsonl"),
                    "columns": {"prompts": per_file, "eval": per_file}, "prompt_format": "chat",
                    "system_prompt": SYSTEM},
           "sft": {"lr": 3.0e-3, "epochs": 1, "max_steps": 40, "batch_size": 16, "max_length": 64},
           "reward_model": {"enabled": False},
           "rl": {"steps": 2, "prompts_per_step": 4, "samples_per_prompt": 4, "learner": {"lr": 2.0e-4}, "save_every": 1,
                  "eval_every": 2, "rollout": {"max_new_tokens": 8},
                  "lora": {"enabled": True, "r": 4, "alpha": 8, "registered": "adapter"},
                  "scoring": {"rewards": [{"fn": "rewards.math:math_answer"}]}},
           "eval": {"limit": 8, "max_new_tokens": 8, "reward": "rewards.math:math_answer", "compare_versions": 2,
                    "compare_prompts": 4}}
    (tmp_path / "gsm.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    res = subprocess.run([sys.executable, "-m", "cli", "run", "pipeline", "-c", "gsm.yaml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    said = res.stdout + res.stderr
    assert res.returncode == 0, said[-4000:]
    assert "look-back failed" not in said and "warning: SFT trained on" not in said  # formats agree: no warning

    # the rollouts are conversational: the system turn, the wrapped question, the assistant's turn opened
    rollouts = pq.read_table(tmp_path / "runs/gsm-chat/rl/rollouts/step-000001.parquet").to_pylist()
    assert all(r["conversational"] for r in rollouts)
    assert all(r["prompt"].startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nAnn has")
               and r["prompt"].endswith("<|im_start|>assistant\n") for r in rollouts)

    from transformers import AutoTokenizer

    client = MlflowClient(uri, registry_uri=uri)
    sft = client.get_model_version_by_alias("gsm-chat-sft", "latest")
    tok = AutoTokenizer.from_pretrained(client.download_artifacts(sft.run_id, "checkpoint", str(tmp_path / "sft")))
    im_end, end = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    ended = [r for r in rollouts if r["ended_with_eos"]]
    assert ended and all(r["completion_ids"][-1] in (im_end, end) for r in ended)
    assert any(r["completion_ids"][-1] == im_end for r in ended)  # SFT taught the turn's end; sampling stops there
    for r in rollouts:  # nothing after the first end token
        ids = r["completion_ids"]
        assert not any(t in (im_end, end) for t in ids[:-1])

    # RL and evaluation decode with the same stop set, logged on each run
    policy = client.get_model_version_by_alias("gsm-chat-policy", "latest")
    rl_run, sft_run = client.get_run(policy.run_id), client.get_run(sft.run_id)
    for run in (rl_run, sft_run):
        decoding = json.loads(run.data.tags["hindsight.decoding"])
        assert set(decoding["stop_tokens"]) == {"<|im_end|>", "<|endoftext|>"}
        assert decoding["checkpoint_settings_not_applied"]["repetition_penalty"] == 1.05
    assert json.loads(rl_run.data.tags["hindsight.decoding"])["rl"]["max_new_tokens"] == 8

    # the version comparison ran on chat prompts (it used to crash here) and the run finished
    assert rl_run.info.status == "FINISHED" and "hindsight.lookback_error" not in rl_run.data.tags
    assert "reports/versions.html" in {f.path for f in client.list_artifacts(rl_run.info.run_id, "reports")}
    # the adapter names its base by a fixed registry version, which resolves
    assert policy.tags["hindsight.base_model"] == f"models:/gsm-chat-sft/{sft.version}"
