"""The vLLM weight push with vLLM's default process layout (issue 25): the engine core and its
model in a process of their own. A stand-in engine with that layout and vLLM 0.33's
serialization rules (tests/standin/vllm) shows that the push of the old code, a callable sent
through `collective_rpc`, fails as the review saw, and that the push by method name with
tensor buckets reaches the engine: its greedy outputs change to the new policy's."""
import os
import sys
from pathlib import Path

import pytest
import torch

STANDIN = Path(__file__).resolve().parents[1] / "standin"


@pytest.fixture
def engine(tmp_path, monkeypatch):
    from hindsight.models.tiny import build_tiny_qwen2
    from hindsight.rollout.engines import vllm as backend

    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STANDIN), *sys.path]))  # the engine process's imports
    monkeypatch.setattr(backend, "vllm_problem", lambda: None)  # the stand-in needs no GPU
    init = build_tiny_qwen2(tmp_path / "init", hidden=32, layers=2)
    eng = backend.VLLMEngine(str(init), "float32", 0, 0.5, 256, bucket_mb=0.02)
    yield eng, init
    eng.llm.llm_engine.engine_core.proc.kill()
    sys.modules.pop("vllm", None)  # else find_spec("vllm") would find the stand-in for later tests


def greedy(engine, tok, prompt):
    exp = engine.generate(tok, [prompt], 1, 8, temperature=0.0, top_p=1.0, seed=0)
    return exp.completion_ids[0][exp.completion_mask[0].bool()].tolist()


def test_pushed_weights_reach_an_engine_in_its_own_process(engine):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    eng, init = engine
    assert not hasattr(eng.llm.llm_engine, "model_executor") and eng.llm.engine_pid() != os.getpid()
    with pytest.raises(TypeError, match="VLLM_ALLOW_INSECURE_SERIALIZATION"):  # the old push's failure
        eng.llm.collective_rpc(lambda worker, weights: None, args=([],))

    tok = AutoTokenizer.from_pretrained(init)
    policy = AutoModelForCausalLM.from_pretrained(init).eval()
    prompt = "Ann has 3 pens and gets 4 more."
    before = greedy(eng, tok, prompt)
    torch.manual_seed(1)
    with torch.no_grad():  # a policy that moved: new weights, so new greedy answers
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    calls = eng.llm.rpc_calls
    eng.load_weights(policy)
    assert eng.llm.rpc_calls - calls > 1  # several buckets, each one collective_rpc
    after = greedy(eng, tok, prompt)
    ids = tok(prompt, return_tensors="pt").input_ids
    want = policy.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                           pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert after != before and after == want[:len(after)] and len(after) > 0
