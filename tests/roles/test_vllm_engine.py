"""vLLM's own engine (its CPU build) as hindsight's `vllm` backend samples, one float32 engine
for the module, on tiny://qwen2-tools-h32 (heads of 32, vLLM's CPU minimum) taught to end its
turns: the decoding contract is the hf sampler's (the same prompt tokens from the chat template,
the same stop tokens, nothing after a stop); the engine's log-probs of what it sampled agree with
the learner's forward to round-off (the real engine-learner gap, logged as `offpolicy/*` in a
run); and the turn method of multi-turn rollouts continues token ids, each row from its own seed."""
import pytest
import torch

from tests.helpers import short_turn_model

pytestmark = pytest.mark.vllm  # vLLM's engine: `make test` runs it in .venv-vllm
CHAT = [[{"role": "user", "content": "What is 12 + 30?"}], [{"role": "user", "content": "Say hi."}]]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from hindsight.models.load import load_causal_lm, load_tokenizer
    from hindsight.rollout.decoding import end_token_ids
    from hindsight.rollout.engines.vllm import VLLMEngine

    path = short_turn_model(tmp_path_factory.mktemp("vllm-engine") / "model", "tiny://qwen2-tools-h32")
    tok, policy = load_tokenizer(path), load_causal_lm(path, "float32").eval()
    eng = VLLMEngine(path, "float32", 0, 0.5, 512)
    eng.load_weights(policy)
    yield eng, tok, policy, end_token_ids(tok, policy)
    eng.close()


def test_the_decoding_contract_is_the_hf_samplers(setup):
    """Chat prompts: the same prompt ids as hf's sampler; every completion ends at one of
    `end_token_ids` or at max_new_tokens, with nothing after its end."""
    from hindsight.rollout.hf import sample_groups

    eng, tok, policy, stops = setup
    assert len(stops) == 2  # <|im_end|> and <|endoftext|>: the template's end of turn and the tokenizer's eos
    ours = eng.generate(tok, CHAT[:1], 8, 24, 1.0, 1.0, seed=3, stop_ids=stops)
    hf = sample_groups(policy, tok, CHAT[:1], [3], 8, 24, 1.0, 1.0)
    assert ours.prompt_ids.tolist() == hf.prompt_ids.tolist()
    lengths = ours.completion_mask.sum(-1).tolist()
    ended = 0
    for row, n in zip(ours.completion_ids.tolist(), lengths):
        assert not any(t in stops for t in row[:n - 1])  # nothing sampled after an end token
        ended += row[n - 1] in stops
        assert row[n - 1] in stops or n == 24
    assert ended >= 6, lengths  # the model was taught to end its turns: most rows do
    again = eng.generate(tok, CHAT[:1], 8, 24, 1.0, 1.0, seed=3, stop_ids=stops)
    assert again.completion_ids.tolist() == ours.completion_ids.tolist()  # a seed is a sample


def test_the_engines_logprobs_are_the_learners_to_round_off_in_float32(setup):
    """The real gap between vLLM's float32 engine and the learner's forward on what the engine
    sampled (temperature 1, top_p 1): the off-policy correction's `auto` is on for vLLM, and
    here it has (almost) nothing to correct."""
    from hindsight.learning.correction import Correction, gap_metrics
    from hindsight.maths.logprobs import budgeted_logprobs

    eng, tok, policy, stops = setup
    exp = eng.generate(tok, CHAT[1:], 8, 24, 1.0, 1.0, seed=5, stop_ids=stops)
    learner = budgeted_logprobs(policy, exp, 1.0, None) * exp.completion_mask                   # (B, T)
    gap = gap_metrics(learner, exp.logprobs, exp.completion_mask, Correction())
    print(f"vLLM float32 vs learner: k3 {gap['offpolicy/mismatch_kl_k3']:.3g}, "
          f"max token gap {gap['offpolicy/max_token_gap']:.3g}")
    assert 0 < gap["offpolicy/max_token_gap"] < 1e-3 and gap["offpolicy/mismatch_kl_k3"] < 1e-7


def test_a_turn_continues_the_token_ids_each_row_from_its_own_seed(setup):
    """`continue_turns` on two left-padded histories: every row ends at a stop or the budget, and a
    row's turn depends on its own generator only (the batch reversed gives each row the same)."""
    from hindsight.maths.experience import pad_left

    eng, tok, policy, stops = setup
    histories = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
                 for c in CHAT]
    ids, mask = pad_left(histories, tok.pad_token_id)                                           # (2, L)
    gens = lambda seeds: [torch.Generator().manual_seed(s) for s in seeds]  # noqa: E731
    out, out_mask = eng.continue_turns(ids, mask, gens([1, 2]), 16, 1.0, 1.0, stops, tok.pad_token_id)
    assert out.shape == out_mask.shape and out.shape[0] == 2
    for row, m in zip(out.tolist(), out_mask.tolist()):
        n = sum(m)
        assert n >= 1 and (row[n - 1] in stops or n == 16) and all(t == tok.pad_token_id for t in row[n:])
    rev, rev_mask = eng.continue_turns(ids.flip(0), mask.flip(0), gens([2, 1]), 16, 1.0, 1.0, stops,
                                       tok.pad_token_id)
    for i, j in ((0, 1), (1, 0)):
        n = int(out_mask[i].sum())
        assert rev[j, :n].tolist() == out[i, :n].tolist() and int(rev_mask[j].sum()) == n


def flat(completions, **_):  # no group carries signal: dynamic sampling samples every round it may
    return [0.0 for _ in completions]


def test_dynamic_sampling_draws_its_rounds_from_the_engine(tmp_path):
    """The RL run with `rl.rollout.backend: vllm` (an engine of its own, float32) and DAPO's dynamic
    sampling: further rounds of fresh prompts are sampled by the engine until the step's groups
    carry signal, two steps train, and every push is checked (`engine/probe_gap` within 1e-3)."""
    from hindsight.config import PipelineConfig
    from hindsight.coordination.run import RLRun
    from hindsight.data.demo import build_demo_data
    from hindsight.models.tiny import build_tiny_model

    build_demo_data(tmp_path / "data", seed=0)
    init = str(build_tiny_model(tmp_path / "init", hidden=64, layers=1, heads=2))  # heads of 32
    cfg = PipelineConfig.model_validate({
        "name": "v", "run_dir": str(tmp_path / "run"),
        "data": {"dir": str(tmp_path / "data"), "dvc_file": None, "prompts": str(tmp_path / "data/prompts.jsonl"),
                 "eval": str(tmp_path / "data/eval.jsonl")},
        "rl": {"steps": 2, "prompts_per_step": 2, "samples_per_prompt": 4, "learner": {"lr": 1e-2},
               "dynamic_sampling": {"enabled": True, "max_rounds": 3},
               "rollout": {"backend": "vllm", "max_new_tokens": 6, "vllm": {"dtype": "float32", "max_model_len": 256}},
               "scoring": {"isolation": "inline", "rewards": [{"fn": "test_vllm_engine:flat"}]}}})
    run = RLRun(cfg, init, None)
    try:
        rounds = []
        for step in range(2):
            _, sampled = run.rollout(step)
            run.score(step)
            run.update(step)
            rounds.append(sampled["dynamic_sampling/rounds"])
            assert 0 <= sampled["engine/probe_gap"] < 1e-3 and sampled["engine/exact_tensors"] >= 3
        assert rounds == [3.0, 3.0], rounds  # the rounds after the first were sampled by the engine too
        groups = {r["group"] for r in run.store.read("rollouts", 0)}
        assert len(groups) > 3, groups  # the first round's 3 (prompts_per_step x oversample 1.5) and more
    finally:
        run.close()


def test_a_ray_rollout_worker_samples_with_its_own_engine(tmp_path):
    """`rl.workers.placement: ray` with `rl.rollout.backend: vllm`, through the CLI: the rollout
    actor builds its engine in its own process (vLLM's engine core a process below it) and samples
    both steps; the stored rows carry the engine's log-probs, within round-off of the learner's."""
    import glob
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pyarrow.parquet as pq

    from hindsight.data.demo import build_demo_data

    root = Path(__file__).resolve().parents[2]
    build_demo_data(tmp_path / "data", seed=0)
    cfg = {"name": "ray-vllm", "model": {"base": "tiny://demo"}, "sft": {"enabled": False},
           "reward_model": {"enabled": False},
           "data": {"dir": "data", "dvc_file": None, "build_demo": False, "prompts": "data/prompts.jsonl",
                    "eval": "data/eval.jsonl"},
           "rl": {"init": "tiny://demo", "steps": 2, "prompts_per_step": 2, "samples_per_prompt": 4,
                  "workers": {"placement": "ray", "rollout": 1},
                  "rollout": {"backend": "vllm", "max_new_tokens": 5,
                              "vllm": {"dtype": "float32", "max_model_len": 256}},
                  "scoring": {"rewards": [{"fn": "rewards.exact:exact_answer"}]}},
           "eval": {"limit": 4}}
    (tmp_path / "ray.yaml").write_text(json.dumps(cfg))
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db", "PYTHONPATH": str(root)}
    res = subprocess.run([sys.executable, "-m", "cli", "run", "rl", "-c", "ray.yaml"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = [r for f in sorted(glob.glob(str(tmp_path / "runs/ray-vllm/rl/rollouts/*.parquet")))
            for r in pq.read_table(f).to_pylist()]
    assert len(rows) == 2 * 2 * 4 and {r["step"] for r in rows} == {0, 1}
    gaps = [abs(a - b) for r in rows for a, b in zip(r["logprobs"], r["engine_logprobs"])]
    assert gaps and max(gaps) < 1e-3  # the engine's own log-probs, against the learner's recompute
