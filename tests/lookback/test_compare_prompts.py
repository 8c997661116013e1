"""`hindsight compare A B --step N` and `--eval`: two runs that differ only in their seed, their
answers to the same prompts side by side, found by prompt hash; the same hash finds a prompt's
traces in MLflow."""
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from hindsight.lookback.traces import prompt_hash
from tests.configs import rl_only, write

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_seeds(tiny_init, prefect_api, tmp_path_factory):
    """Two 2-step runs on 4 prompts (2 a step: each run samples all 4, in its own order)."""
    work, init = tiny_init
    tmp = tmp_path_factory.mktemp("compare")
    data = tmp / "data"
    data.mkdir()
    lines = (work / "data/prompts.jsonl").read_text().splitlines()[:4]
    (data / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    (data / "eval.jsonl").write_text((work / "data/eval.jsonl").read_text())
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db",
           "PYTHONPATH": str(ROOT)}
    for seed in (0, 1):
        cfg = rl_only(f"seed{seed}", data, init, steps=2, samples_per_prompt=3) | {"seed": seed}
        write(tmp / f"seed{seed}.yaml", cfg)
        done = subprocess.run([sys.executable, "-m", "cli", "run", "rl", "-c", f"seed{seed}.yaml"], cwd=tmp, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return tmp, env


def _cli(args, tmp, env):
    return subprocess.run([sys.executable, "-m", "cli", "compare", *args], cwd=tmp, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_same_prompts_side_by_side_at_a_step(two_seeds):
    tmp, env = two_seeds
    res = _cli(["runs/seed0", "runs/seed1", "--step", "2", "--out", "step2.html"], tmp, env)
    assert res.returncode == 0, res.stdout + res.stderr
    rows_a = pq.read_table(tmp / "runs/seed0/rl/rollouts/step-000002.parquet").to_pylist()
    want = {prompt_hash(r["prompt"]) for r in rows_a}
    page = (tmp / "step2.html").read_text()
    lined = re.findall(r'data-prompt-hash="(\w+)"', page)
    assert sorted(lined) == sorted(want) and len(want) == 2
    # every prompt seed0 sampled at step 2, seed1 sampled at step 1 or 2: each row shows both
    b_steps = {}
    for shard in (0, 1):
        for r in pq.read_table(tmp / f"runs/seed1/rl/rollouts/step-{shard + 1:06d}.parquet").to_pylist():
            b_steps.setdefault(prompt_hash(r["prompt"]), set()).add(shard + 1)
    assert want <= set(b_steps)
    for h in want:
        row = page.split(f'data-prompt-hash="{h}"')[1].split('<tr class="prompt-row"')[0]
        sides = re.findall(r'<td class="side" data-step="(\d+)">', row)
        assert sides[0] == "2" and int(sides[1]) in b_steps[h] and len(sides) == 2
        assert row.count('class="completion-row"') == 6  # three samples each, shaded by token
    assert "2 prompts of step 2; 2 also sampled by seed1" in res.stdout


def test_the_eval_answers_side_by_side_and_the_hash_finds_the_traces(two_seeds):
    tmp, env = two_seeds
    res = _cli(["runs/seed0", "runs/seed1", "--eval", "--out", "eval.html"], tmp, env)
    assert res.returncode == 0, res.stdout + res.stderr
    answers = [json.loads((tmp / f"runs/seed{s}/rl/evals/step-000002.json").read_text())["answers"] for s in (0, 1)]
    page = (tmp / "eval.html").read_text()
    hashes = re.findall(r'data-prompt-hash="(\w+)"', page)
    assert hashes == [prompt_hash(a["prompt"]) for a in answers[0]] and len(hashes) == 4
    for a, b in zip(*answers):
        row = page.split(f'data-prompt-hash="{prompt_hash(a["prompt"])}"')[1].split("</tr>")[0]
        cells = re.findall(r'data-correct="(\d)">(.*?)</td>', row, re.S)
        assert [(int(c), html.unescape(t)) for c, t in cells] == [(int(a["correct"]), a["answer"]),
                                                                  (int(b["correct"]), b["answer"])]

    import mlflow

    mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
    exp = mlflow.get_experiment_by_name("hindsight").experiment_id
    found = mlflow.search_traces(locations=[exp], return_type="list", filter_string=
                                 f"tags.`hindsight.prompt_hash` = '{hashes[0]}' AND tags.`hindsight.kind` = 'eval'")
    assert len(found) == 4  # both runs, after step 0 and step 2
    assert {t.data.spans[0].inputs["prompt"] for t in found} == {answers[0][0]["prompt"]}


def test_a_step_that_one_run_never_stored_is_one_error(two_seeds):
    tmp, env = two_seeds
    res = _cli(["runs/seed0", "runs/seed1", "--step", "7"], tmp, env)
    assert res.returncode != 0 and "step 7 has no stored rollouts and scores (stored steps: 1..2)" in res.stderr
