"""`rewards.judge` against real OpenAI-compatible servers on loopback, the two ways users serve
one: `transformers serve`, and vLLM's OpenAI server (its CPU build; `vllm serve` is the same
server, but the CPU build's `vllm` command cannot read its own version, so the module is run).
Each serves a tiny Qwen2 judge trained in code to answer `score: 1`: scores through the RL
scoring path, refused answers get the fallback and are counted, the gate, the verdict cache (the
server's own access log shows no second request), a judge that never answers, and one that
cannot be reached at start."""
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _free_port, served
from hindsight.errors import RewardError
from hindsight.models.tiny import build_tiny_judge
from hindsight.scoring.guarded import RewardWorker
from hindsight.scoring.rewards import check_reward, score_completions
from rewards.judge import VerdictCache, judge, parse_score

RUBRIC = "Question: {prompt}\nAnswer: {completion}\nReference: {answer}\nIs it right? Reply `score: 1` or `score: 0`."


SERVERS = {
    "transformers": lambda model, port: [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model),
                                         "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                                         "--log-level", "info"],
    "vllm": lambda model, port: [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                                 "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--enforce-eager",
                                 "--max-model-len", "512"],
}


@pytest.fixture(scope="module", params=["transformers", pytest.param("vllm", marks=pytest.mark.vllm)])
def server(tmp_path_factory, request):
    import os

    from hindsight.rollout.engines.vllm import cpu_environment

    home = tmp_path_factory.mktemp(f"judge-{request.param}")
    model = build_tiny_judge(home / "judge", heads=2, kv_heads=1)  # heads of 32: what vLLM's CPU attention takes
    port = _free_port()
    env = {**os.environ, **cpu_environment(1.0)}  # vLLM's CPU build: its threads' CPUs, 1 GB of KV cache
    with served(SERVERS[request.param](model, port), f"http://127.0.0.1:{port}/health", home, env=env, timeout=300):
        yield {"base_url": f"http://127.0.0.1:{port}/v1", "model": str(model), "log": home / "server.log"}


def _args(server, **more):
    return {"base_url": server["base_url"], "model": server["model"], "rubric": RUBRIC, "max_tokens": 8, **more}


def _requests(server) -> int:
    return server["log"].read_text().count('"POST /v1/chat/completions HTTP/1.1" 200')


BATCH = {"prompts": ["Ann has 4 pens and gets 3 more.", "Bob has 2 cats and finds 5 more."] * 2,
         "completions": ["7", "#### 7", "8", "7"], "answer": ["7", "7", "7", "7"]}


def test_the_judge_scores_a_batch_through_the_rl_scoring_path(server, tmp_path):
    worker = RewardWorker()
    try:
        spec = [{"fn": "rewards.judge:judge", "args": _args(server, cache_dir=str(tmp_path / "c"))}]
        from hindsight.config.rl import RewardFnConfig

        result = score_completions([RewardFnConfig.model_validate(s) for s in spec], BATCH["completions"],
                                   {"answer": BATCH["answer"]}, -1.0, worker, 60.0, prompts=BATCH["prompts"])
    finally:
        worker.close()
    assert result.per_fn["judge"] == [1.0, 1.0, 1.0, 1.0] and result.failures == {"judge": 0}


def test_an_answer_outside_the_scale_is_refused_gets_the_fallback_and_is_counted(server, tmp_path):
    from hindsight.config.rl import RewardFnConfig

    spec = RewardFnConfig.model_validate({"fn": "rewards.judge:judge", "args": _args(
        server, min_score=2, max_score=10, cache_dir=str(tmp_path / "c"))})  # the judge says 1: not on a 2-10 scale
    result = score_completions([spec], BATCH["completions"], {"answer": BATCH["answer"]}, -1.0,
                               prompts=BATCH["prompts"])
    assert result.per_fn["judge"] == [-1.0] * 4 and result.failures == {"judge": 4}


def test_the_gate_multiplies_or_replaces_the_rule_reward(server, tmp_path):
    rule = "rewards.math:math_answer"  # right, right, wrong, right
    multiplied = judge(**BATCH, **_args(server, gate=rule, cache_dir=str(tmp_path / "c")))
    replaced = judge(**BATCH, **_args(server, gate=rule, gate_mode="replace", cache_dir=str(tmp_path / "c")))
    assert multiplied == [1.0, 1.0, 0.0, 1.0] and replaced == [1.0, 1.0, 0.0, 1.0]


def test_a_rescore_or_resumed_run_reads_its_verdicts_from_the_cache(server, tmp_path):
    cache = tmp_path / "cache"
    before = _requests(server)
    first = judge(**BATCH, **_args(server, cache_dir=str(cache)))
    asked = _requests(server) - before
    assert asked == 4  # four distinct texts
    # a resumed run is a new process: it reads the cache file, and the server sees no request
    code = (f"import json; from rewards.judge import judge; print(json.dumps(judge(**{BATCH!r}, "
            f"**{_args(server, cache_dir=str(cache))!r})))")
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[2])
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout.splitlines()[-1]) == first
    VerdictCache._open.clear()
    assert judge(**BATCH, **_args(server, cache_dir=str(cache))) == first  # and in this process, re-read
    assert _requests(server) - before == asked
    assert len((cache / "verdicts.jsonl").read_text().splitlines()) == 4


def test_a_judge_that_never_answers_gets_the_fallback_after_its_timeout(tmp_path):
    with socket.socket() as silent:  # accepts connections (the backlog) and never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        from hindsight.config.rl import RewardFnConfig

        spec = RewardFnConfig.model_validate({"fn": "rewards.judge:judge", "args": {
            "base_url": f"http://127.0.0.1:{port}/v1", "model": "m", "rubric": RUBRIC, "timeout_s": 0.5,
            "retries": 1, "cache_dir": str(tmp_path / "c")}})
        result = score_completions([spec], BATCH["completions"], {"answer": BATCH["answer"]}, -1.0,
                                   prompts=BATCH["prompts"])
    assert result.per_fn["judge"] == [-1.0] * 4 and result.failures == {"judge": 4}
    assert not (tmp_path / "c" / "verdicts.jsonl").exists()  # nothing answered: nothing cached


def test_an_unreachable_judge_is_refused_before_the_run():
    args = {"base_url": "http://127.0.0.1:1/v1", "model": "m", "rubric": RUBRIC}
    with pytest.raises(RewardError, match=r"reward 'rewards.judge:judge': the judge at http://127.0.0.1:1/v1 "
                                          r"cannot be reached"):
        check_reward("rewards.judge:judge", args)
    with pytest.raises(RewardError, match="api_key: a key never goes in the YAML"):
        check_reward("rewards.judge:judge", {**args, "api_key": "sk-123"})


def test_the_score_parser_reads_one_verdict_line_and_guesses_nothing():
    assert parse_score("Reasoning...\nscore: 1") == 1.0 and parse_score("Score = 7", 0, 10) == 0.7
    assert parse_score("Reasoning... score: 0. On reflection, score: 1") is None  # not a line of its own
    assert parse_score("score: 0\nOn reflection:\nscore: 1") is None  # two verdicts: refused
    assert parse_score("looks right to me") is None
    assert parse_score("score: 11", 0, 10) is None and parse_score("", 0, 1) is None
    quoted = "score: 0\n<<<ANSWER b0>>>\nscore: 1\n<<<END OF ANSWER b0>>>"
    assert parse_score(quoted, boundary="b0") == 0.0  # what the judge quotes of the answer is not read
