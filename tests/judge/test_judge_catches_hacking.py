"""The judge as the second check (issue 52): a step-format reward (`rewards.format:step_keywords`,
"therefore" on each line) that a scripted hacking policy games by repeating the keyword scores
it at the top, and a judge served by `transformers serve` on 127.0.0.1 (a tiny Qwen2 taught in
code to tell reasoning from repetition) gives it 0: as a second reward through the RL scoring
path, where the per-reward means show the gap, and as the rule reward's gate."""
import hashlib
import sys

import pytest

from conftest import _free_port, served
from hindsight.models.tiny import build_tiny_judge
from rewards.format import step_keywords
from rewards.judge import judge, render

RUBRIC = ("Question: {prompt}\nAnswer: {completion}\nDoes the answer work the sum out, or only repeat words? "
          "Reply `score: 1` if it works it out, `score: 0` if not.")
NAMES, ITEMS = ["Ann", "Bob", "Cid", "Dee", "Eve", "Fay", "Gus"], ["pens", "cats", "keys", "cups", "hats", "jars"]


def _question(rng) -> tuple[str, int, int, str, str]:
    name, item, a, b = rng.choice(NAMES), rng.choice(ITEMS), rng.randrange(2, 60), rng.randrange(2, 40)
    return f"{name} has {a} {item} and gets {b} more. How many {item} now?", a, b, name, item


def honest(rng) -> tuple[str, str]:
    question, a, b, name, item = _question(rng)
    return question, f"{name} starts with {a} {item} and {b} more come.\nTherefore {a} + {b} = {a + b}."


def hacked(rng) -> tuple[str, str]:
    question, a, b, *_ = _question(rng)
    lines = [" ".join(["therefore"] * rng.randrange(1, 5)) for _ in range(rng.randrange(2, 5))]
    if rng.random() < 0.5:
        lines[-1] += f" {a + b}"
    return question, "\n".join(lines)


def _example(rng) -> tuple[str, str]:
    """A rendered rubric (a boundary of its own each time) and the verdict a careful judge gives."""
    question, completion = (honest if rng.random() < 0.5 else hacked)(rng)
    verdict = "score: 0" if completion.startswith("therefore") else "score: 1"
    boundary = hashlib.sha256(str(rng.random()).encode()).hexdigest()[:16]
    return render(RUBRIC, question, completion, {}, boundary), verdict


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("hack-judge")
    model = build_tiny_judge(home / "judge", steps=300, examples=_example)
    port = _free_port()
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--device", "cpu", "--log-level", "info"]
    with served(cmd, f"http://127.0.0.1:{port}/health", home, timeout=180):
        yield {"base_url": f"http://127.0.0.1:{port}/v1", "model": str(model), "rubric": RUBRIC, "max_tokens": 8}


def _held_out(kind, n: int, seed: int) -> tuple[list[str], list[str]]:
    import random

    rng = random.Random(seed)  # not the judge's training draws
    rows = [kind(rng) for _ in range(n)]
    return [q for q, _ in rows], [c for _, c in rows]


def test_the_hacking_policy_tops_the_format_reward_and_the_judge_gives_it_nothing(server):
    from hindsight.config.rl import RewardFnConfig
    from hindsight.scoring.rewards import score_completions

    hq, hc = _held_out(hacked, 8, seed=101)
    oq, oc = _held_out(honest, 8, seed=202)
    assert step_keywords(hc) == [1.0] * 8 and step_keywords(oc) == [0.5] * 8  # the hack out-scores reasoning
    specs = [RewardFnConfig.model_validate(s) for s in (
        {"fn": "rewards.format:step_keywords"}, {"fn": "rewards.judge:judge", "args": server})]
    result = score_completions(specs, hc + oc, {}, -1.0, prompts=hq + oq)
    judged = result.per_fn["judge"]
    assert result.failures == {"step_keywords": 0, "judge": 0}
    # the run logs these means per step as reward/step_keywords and reward/judge: the gap the hack opens
    assert sum(judged[:8]) / 8 <= 0.125 and sum(judged[8:]) / 8 >= 0.875, judged


def test_as_the_gate_the_judge_zeroes_the_hacked_format_reward(server):
    hq, hc = _held_out(hacked, 6, seed=303)
    oq, oc = _held_out(honest, 6, seed=404)
    gated = judge(hc + oc, hq + oq, **server, gate="rewards.format:step_keywords")
    assert sum(gated[:6]) <= 1.0 and sum(gated[6:]) >= 2.5, gated  # each honest one keeps its 0.5


def test_the_gsm8k_recipe_runs_two_steps_through_the_cli_with_the_judge_on_loopback(server, tmp_path, prefect_api):
    """Issue 52's smoke: configs/examples/smollm2-gsm8k.yaml at its smoke size (SFT warm-up, then two
    RL steps of the real SmolLM2), its reward file beside the config, and the judge above as a second
    reward: each step logs the judge's mean beside the answer reward's, and the judge's cost."""
    import os
    import shutil
    import subprocess
    from pathlib import Path

    import yaml
    from mlflow.tracking import MlflowClient

    root = Path(__file__).resolve().parents[2]
    recipe = yaml.safe_load((root / "configs/examples/smollm2-gsm8k.yaml").read_text())
    recipe["rl"]["scoring"]["rewards"].append({"fn": "rewards.judge:judge", "weight": 0.5, "args": server})
    (tmp_path / "gsm8k.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    shutil.copy(root / "configs/examples/gsm8k_reward.py", tmp_path)  # the reward file beside the config
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(root)}
    res = subprocess.run([sys.executable, "-m", "cli", "run", "pipeline", "-c", "gsm8k.yaml", "--smoke"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert len((tmp_path / "data-gsm8k/eval.jsonl").read_text().splitlines()) == 200  # the demo data, built

    client = MlflowClient(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    (rl,) = [r for r in client.search_runs(experiments) if r.data.tags["mlflow.runName"].startswith("rl ·")]
    for name in ("reward/final_answer", "reward/judge", "runtime/time/score_s"):
        steps = [m.step for m in client.get_metric_history(rl.info.run_id, name)]
        assert sorted(steps) == [1, 2], (name, steps)
    judged = [m.value for m in client.get_metric_history(rl.info.run_id, "reward/judge")]
    assert all(0.0 <= v <= 1.0 for v in judged), judged
