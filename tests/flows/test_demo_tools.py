"""The multi-turn demo at smoke size, through the CLI as a user runs it: configs/demo-tools.yaml
(SFT on tool-use traces, then GRPO with the sandboxed add tool), a few steps of each. The stored
trajectories carry their turns, the add tool really ran in the sandbox and answered, the RL
run logs the multi-turn metrics, and the registered policy keeps the tool template."""
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from hindsight.data.toolsums import build_tool_data

ROOT = Path(__file__).resolve().parents[2]
# the demo's data at smoke size: the full set's 16,000 SFT traces would be tokenized for 120 steps
SMALL = {"n_sft": 1000, "n_sft_guess": 1000}
SMOKE = ["--smoke", "--set", "data.dvc_file=null"]  # the config's own smoke preset, as a user runs it


def run_demo(tmp_path: Path, *overrides: str) -> tuple[dict, list[dict]]:
    """The tools demo's pipeline at smoke size through the CLI; (its env, the stored RL rows, each
    checked: a trajectory's turns, the loss on the model's tokens only)."""
    for name in ("demo-tools.yaml", "demo_tools.py"):
        shutil.copy(ROOT / "configs" / name, tmp_path / name)
    build_tool_data(tmp_path / "data-tools", **SMALL)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": str(ROOT),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    res = subprocess.run([sys.executable, "-m", "cli", "run", "pipeline", "-c", "demo-tools.yaml", *SMOKE,
                          *overrides], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    files = sorted(glob.glob(str(tmp_path / "runs/demo-tools/rl/rollouts/*.parquet")))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert len(rows) == 2 * 2 * 2
    for r in rows:
        turns = json.loads(r["turns"])
        assert turns[0]["role"] == "assistant" and len(r["action_mask"]) == len(r["completion_ids"])
        for t in turns:
            assert set(r["action_mask"][t["start"]:t["end"]]) <= {1 if t["role"] == "assistant" else 0}
    return env, rows


def test_the_tools_demo_runs_sft_then_multi_turn_rl(tmp_path):
    env, rows = run_demo(tmp_path)
    # after SFT on the traces the policy calls the tool, and the sandboxed tool answers
    calls = [c for r in rows for t in json.loads(r["turns"]) for c in t.get("calls", [])]
    assert calls and any(not c["error"] and c["result"] == str(sum(c["arguments"].values())) for c in calls), calls
    client = MlflowClient(env["MLFLOW_TRACKING_URI"], registry_uri=env["MLFLOW_TRACKING_URI"])
    policy = client.get_model_version_by_alias("demo-tools-policy", "latest")
    metrics = client.get_run(policy.run_id).data.metrics
    assert {"multiturn/turns", "multiturn/tool_calls", "multiturn/tool_error_rate",
            "multiturn/retokenize_mismatches"} <= metrics.keys()
    assert metrics["multiturn/tool_calls"] > 0
    traced = _traces_hold_the_stored_trajectories(env["MLFLOW_TRACKING_URI"], policy.run_id,
                                                  tmp_path / "runs/demo-tools/rl")
    _the_traces_tab_shows_them(tmp_path, policy.run_id, traced)


@pytest.mark.vllm
def test_the_tools_demo_takes_its_turns_from_vllms_engine(tmp_path):
    """The same demo at smoke size with `rl.rollout.backend: vllm`, vLLM's own engine (its CPU
    build): every model turn is the engine's, the stored trajectories carry their turns with the
    loss on the model's tokens only, and the engine is checked against the learner after every
    weights push. (Whether a smoke-size SFT's calls parse is the hf test's; here, the engine.)"""
    env, _ = run_demo(tmp_path, "--set", "rl.rollout.backend=vllm", "--set", "rl.rollout.vllm.dtype=float32",
                      "--set", "rl.rollout.vllm.max_model_len=512",
                      "--set", "model.base=tiny://qwen2-tools-h32")  # heads of 32: vLLM's CPU minimum
    client = MlflowClient(env["MLFLOW_TRACKING_URI"], registry_uri=env["MLFLOW_TRACKING_URI"])
    policy = client.get_model_version_by_alias("demo-tools-policy", "latest")
    gaps = client.get_metric_history(policy.run_id, "runtime/engine/probe_gap")
    assert len(gaps) == 2 and all(0 <= m.value < 1e-3 for m in gaps), gaps
    assert client.get_run(policy.run_id).data.params["rl.rollout.backend"] == "vllm"


def _the_traces_tab_shows_them(tmp_path: Path, run_id: str, trace) -> None:
    """The MLflow UI, in headless Chromium, on the run's Traces tab: the run's traces are listed
    (their prompts), and a trace opened from the list shows its turn and tool spans by name."""
    import html as html_lib
    import re

    from tests.conftest import _free_port, served
    from tests.lookback.test_report import chromium

    exe, port = chromium(), _free_port()
    url = f"http://127.0.0.1:{port}"
    run = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(run_id)
    exp, run_name = run.info.experiment_id, run.info.run_name
    assert run_name == "rl · demo-tools → demo-tools-policy v1", run_name  # told apart from every other rl run
    (tmp_path / "ui").mkdir()

    def page(link: str, png: Path) -> str:
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=30000", "--window-size=1800,1000"]
        subprocess.run([exe, *flags, f"--screenshot={png}", link], capture_output=True, timeout=180)
        dom = subprocess.run([exe, *flags, "--dump-dom", link], capture_output=True, text=True, timeout=180).stdout
        return re.sub(r"\s+", " ", html_lib.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"<style.*?</style>", " ", dom,
                                                                                      flags=re.S))))

    with served([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                 "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db", "--workers", "1"], f"{url}/health",
                tmp_path / "ui"):
        tab = f"{url}/#/experiments/{exp}/runs/{run_id}/traces"
        listed = page(tab, tmp_path / "traces-tab.png")
        assert run_name in listed, listed[:3000]  # the run page is headed by it
        assert "16 of 16" in listed and trace.data.spans[0].inputs["prompt"][:40].split("\n")[0] in listed, listed[:3000]
        opened = page(f"{tab}?selectedEvaluationId={trace.info.trace_id}", tmp_path / "trace-open.png")
        names = {s.name for s in trace.data.spans}
        assert names and all(name in opened for name in names), (names, opened[:3000])
        charts = page(f"{url}/#/experiments/{exp}/runs/{run_id}/model-metrics", tmp_path / "charts.png")
        _watched_charts_come_first(charts)
    assert (tmp_path / "traces-tab.png").read_bytes()[:4] == b"\x89PNG"
    print(f"screenshots: {tmp_path / 'traces-tab.png'} {tmp_path / 'trace-open.png'}")


def _watched_charts_come_first(page: str) -> None:
    """The run page's chart sections, in the order MLflow lays them out: every section a
    practitioner watches (reward, eval, policy's KL and entropy, lengths, turns) before the first
    bookkeeping one (runtime/...), and no metric in MLflow's unprefixed section, which comes last."""
    import re

    sections = re.findall(r"([A-Za-z_/]+|Model metrics) \((\d+)\) Add chart", page)
    order = [name for name, count in sections if name != "Model metrics"]
    assert order and dict(sections).get("Model metrics", "0") == "0", page[:3000]  # MLflow shows it, empty
    first_runtime = next(i for i, name in enumerate(order) if name.startswith("runtime"))
    watched = order[:first_runtime]
    assert {"reward", "eval", "policy", "response_length", "multiturn"} <= set(watched), order
    assert all(name.startswith("runtime") for name in order[first_runtime:]), order


def _traces_hold_the_stored_trajectories(uri: str, run_id: str, rl_dir: Path):
    """Every stored trajectory (2 steps x 4, under the default 8 a step) and every eval answer (4 at
    step 0 and 4 at the end) is a trace of the run, found by run id: a span per model turn and
    per tool call, in the trajectory's order, and the stored scores as feedback."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    exp = MlflowClient(uri).get_run(run_id).info.experiment_id
    traces = mlflow.search_traces(locations=[exp], run_id=run_id, return_type="list", max_results=500)
    train = {int(t.info.tags["hindsight.index"]) + 100 * int(t.info.tags["hindsight.step"]): t for t in traces
             if t.info.tags["hindsight.kind"] == "train"}
    evals = [t for t in traces if t.info.tags["hindsight.kind"] == "eval"]
    assert len(train) == 8 and len(evals) == 8, (len(train), len(evals))
    assert sorted({t.info.tags["hindsight.step"] for t in evals}) == ["0", "2"]
    for shard in (0, 1):
        rows = pq.read_table(rl_dir / f"rollouts/step-{shard + 1:06d}.parquet").to_pylist()
        scores = {s["index"]: s for s in pq.read_table(rl_dir / f"scores/step-{shard + 1:06d}.parquet").to_pylist()}
        for r in rows:
            t = train[r["index"] + 100 * (shard + 1)]
            kinds = [(s.span_type, s.name.split(" ")[0]) for s in t.data.spans if s.parent_id is not None]
            expected = []
            for turn in json.loads(r["turns"]):
                if turn["role"] == "assistant":
                    expected.append(("LLM", "model"))
                else:
                    expected += [("TOOL", "tool")] * len(turn.get("calls", [])) or [("TOOL", "environment")]
            assert kinds == expected, (kinds, expected)
            feedback = {a.name: a.value for a in t.info.assessments}
            assert feedback["reward"] == scores[r["index"]]["reward"]
            assert feedback["reward/exact_answer"] == scores[r["index"]]["reward_exact_answer"]
            root = next(s for s in t.data.spans if s.parent_id is None)
            assert root.inputs["prompt"] == r["prompt"] and root.attributes["policy_version"] == r["weights_version"]
            calls = [c for turn in json.loads(r["turns"]) for c in turn.get("calls", [])]
            for span, call in zip([s for s in t.data.spans if s.span_type == "TOOL"], calls):
                assert span.inputs["arguments"] == call["arguments"] and span.outputs["result"] == call["result"]
    return max(train.values(), key=lambda t: len(t.data.spans))  # one with a tool call, if any


def test_the_guess_demo_plays_its_game_over_several_turns(tmp_path):
    """configs/demo-guess.yaml at smoke size: every stored game's turns alternate the model's
    guesses with the environment's hints, and its reward is what the environment gave."""
    for name in ("demo-guess.yaml", "demo_tools.py"):
        shutil.copy(ROOT / "configs" / name, tmp_path / name)
    build_tool_data(tmp_path / "data-tools", **SMALL)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": str(ROOT),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    res = subprocess.run([sys.executable, "-m", "cli", "run", "pipeline", "-c", "demo-guess.yaml", *SMOKE],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    files = sorted(glob.glob(str(tmp_path / "runs/demo-guess/rl/rollouts/*.parquet")))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    scores = [r for f in sorted(glob.glob(str(tmp_path / "runs/demo-guess/rl/scores/*.parquet")))
              for r in pq.read_table(f).to_pylist()]
    games = [json.loads(r["turns"]) for r in rows]
    assert sum(len(g) > 1 for g in games) >= len(games) // 2, "most games take several turns"
    for g in games:
        assert [t["role"] for t in g] == ["assistant", "user"] * (len(g) // 2) + ["assistant"] * (len(g) % 2)
        assert all(t["text"] in ("higher", "lower") for t in g if t["role"] == "user")
    given = {(r["step"], r["index"]): json.loads(r["columns"])["env_reward"] for r in rows}
    assert len(scores) == len(rows) and any(s["reward"] > 0 for s in scores)
    for s in scores:
        assert s["reward"] == given[(s["step"], s["index"])]
