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


def _standin(tmp_path, monkeypatch, dtype: str, hidden: int, bucket_mb: float, receiver: str | None = None):
    """The stand-in engine in its own process, on a tiny Qwen2; stopped and forgotten after the test."""
    from hindsight.models.tiny import build_tiny_qwen2
    from hindsight.rollout.engines import vllm as backend

    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(STANDIN), *sys.path]))  # the engine process's imports
    monkeypatch.setattr(backend, "vllm_problem", lambda: None)  # the stand-in needs no GPU
    if receiver:
        monkeypatch.setattr(backend, "WEIGHT_RECEIVER", receiver)
    init = build_tiny_qwen2(tmp_path / "init", hidden=hidden, layers=2)
    eng = backend.VLLMEngine(str(init), dtype, 0, 0.5, 256, bucket_mb=bucket_mb)
    yield eng, init
    eng.llm.llm_engine.engine_core.proc.kill()
    sys.modules.pop("vllm", None)  # else find_spec("vllm") would find the stand-in for later tests


@pytest.fixture
def engine(tmp_path, monkeypatch):
    yield from _standin(tmp_path, monkeypatch, "float32", hidden=32, bucket_mb=0.02)


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


@pytest.fixture
def bf16_engine(tmp_path, monkeypatch):
    """The stand-in engine in bf16 with a receiver a test can read back."""
    yield from _standin(tmp_path, monkeypatch, "bfloat16", hidden=64, bucket_mb=0.05,
                        receiver="readback.ReadbackReceiver")


def _same_bits(eng, policy) -> bool:
    held = eng.llm.collective_rpc("readback_state")[0]
    want = {k: v.detach().to(torch.bfloat16) for k, v in policy.state_dict().items()}
    return held.keys() == want.keys() and all(torch.equal(held[k].view(torch.int16), want[k].view(torch.int16))
                                              for k in want)


def test_deltas_keep_the_engine_bit_equal_and_a_lost_or_torn_one_brings_the_full_copy(bf16_engine):
    """20 versions at an RL learning rate (1e-6) go as deltas in the engine's dtype (bf16), each leaving
    the engine's weights bit-equal to the policy's in bf16; a delta the engine cannot apply (it
    missed a version) or that fails its checksum (a flipped bit) is refused and the full copy
    follows at once."""
    from transformers import AutoModelForCausalLM

    eng, init = bf16_engine
    assert eng.sender.publication.dtype == torch.bfloat16  # asked of the engine, not assumed
    policy = AutoModelForCausalLM.from_pretrained(init)
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    ids = torch.randint(3, 200, (4, 16), generator=torch.Generator().manual_seed(0))

    def train_and_publish():
        opt.zero_grad()
        policy(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        return eng.load_weights(policy)

    first = eng.load_weights(policy)
    assert first["publish/delta"] == 0.0 and _same_bits(eng, policy)
    full_bytes = first["publish/bytes"]
    ratios = []
    for _ in range(20):
        m = train_and_publish()
        assert m["publish/delta"] == 1.0 and m["publish/resent_full"] == 0.0
        assert _same_bits(eng, policy)
        ratios.append(m["publish/bytes"] / full_bytes)
    print(f"publish_bytes delta/full over 20 versions: {min(ratios):.4f}-{max(ratios):.4f}")
    assert 0 < max(ratios) < 0.1, ratios  # bf16: few elements move in a step at an RL learning rate

    # a lost delta: the sender moves on to a version the engine never got
    eng.sender.publication.next(99, dict(policy.named_parameters()))
    m = train_and_publish()
    assert m["publish/resent_full"] == 1.0 and _same_bits(eng, policy)

    # a torn delta: one flipped bit in transit
    real = eng.llm.collective_rpc

    def flip_once(method, timeout=None, args=(), kwargs=None):
        if method == "hindsight_apply_delta" and not flip_once.done:
            version, base, sha, tensors = args
            key = next(k for k in sorted(tensors) if tensors[k].numel())
            torn = dict(tensors)
            torn[key] = tensors[key].clone()
            torn[key].view(torch.uint8)[0] ^= 1
            flip_once.done = True
            args = (version, base, sha, torn)
        return real(method, timeout, args, kwargs)

    flip_once.done = False
    eng.llm.collective_rpc = flip_once
    m = train_and_publish()
    assert flip_once.done and m["publish/resent_full"] == 1.0 and _same_bits(eng, policy)
    m = train_and_publish()  # and deltas go on from the full copy
    assert m["publish/delta"] == 1.0 and m["publish/resent_full"] == 0.0 and _same_bits(eng, policy)
