"""The weight push into vLLM's own engine (its CPU build, in its default layout: the engine core
and its model in a process of their own), one bf16 engine for the module. Versions after the
first go as deltas of the engine's dtype; after each, the worker's copy is bit-equal to the
policy's in bf16, and the engine is checked against the learner inside the engine (exact
fingerprints where vLLM keeps a tensor readable, the log-prob probe for the rest). A lost or torn
delta brings the full copy; an engine tensor changed behind the push, or a learner that moved
without a push, stops the run naming the version; a LoRA policy is pushed merged."""
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.vllm  # vLLM's engine: `make test` runs it in .venv-vllm


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """vLLM's engine on a tiny Qwen2 (head size 32, vLLM's CPU minimum), bf16, small buckets."""
    from hindsight.models.tiny import build_tiny_qwen2
    from hindsight.rollout.engines import vllm as backend

    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(HERE))  # the engine core (spawned) imports the test receiver by name
    mp.setenv("PYTHONPATH", ":".join([str(HERE), *sys.path]))
    mp.setattr(backend, "WEIGHT_RECEIVER", "vllm_receiver.TestReceiver")
    init = build_tiny_qwen2(tmp_path_factory.mktemp("m") / "init", hidden=128, layers=2)
    eng = backend.VLLMEngine(str(init), "bfloat16", 0, 0.5, 256, bucket_mb=0.05)
    yield eng, init
    eng.close()
    mp.undo()


def _held(eng) -> dict:
    from safetensors.torch import load

    return load(eng.llm.collective_rpc("readback_held")[0])


def _same_bits(eng, policy) -> bool:
    held = _held(eng)
    want = {k: v.detach().to(torch.bfloat16) for k, v in policy.named_parameters()}
    return held.keys() == want.keys() and all(torch.equal(held[k].view(torch.int16), want[k].view(torch.int16))
                                              for k in want)


def test_deltas_keep_the_engine_equal_and_a_lost_or_torn_one_brings_the_full_copy(engine):
    """20 versions at an RL learning rate (1e-6) go as deltas in the engine's dtype (bf16); after
    each the engine passes its check (`engine_exact_tensors` > 0, the probe within tolerance)."""
    from transformers import AutoModelForCausalLM

    eng, init = engine
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
    assert first["publish/exact_tensors"] >= 5 and first["publish/probe_gap"] < 0.3
    full_bytes = first["publish/bytes"]
    ratios = []
    for _ in range(20):
        m = train_and_publish()
        assert m["publish/delta"] == 1.0 and m["publish/resent_full"] == 0.0 and _same_bits(eng, policy)
        assert m["publish/probe_gap"] < 0.3
        ratios.append(m["publish/bytes"] / full_bytes)
    print(f"publish_bytes delta/full over 20 versions: {min(ratios):.4f}-{max(ratios):.4f}")
    assert 0 < max(ratios) < 0.1, ratios  # bf16: few elements move in a step at an RL learning rate

    # a lost delta: the sender moves on to a version the engine never got
    eng.sender.publication.next(99, dict(policy.named_parameters()))
    m = train_and_publish()
    assert m["publish/resent_full"] == 1.0 and _same_bits(eng, policy)

    # a torn delta: one flipped bit in the bytes that cross to the engine
    real = eng.llm.collective_rpc

    def flip_once(method, timeout=None, args=(), kwargs=None):
        if method == "hindsight_apply_delta" and not flip_once.done:
            version, base, sha, data = args
            torn = bytearray(data)
            torn[-1] ^= 1  # the last byte is tensor data (safetensors: the header comes first)
            flip_once.done = True
            args = (version, base, sha, bytes(torn))
        return real(method, timeout, args, kwargs)

    flip_once.done = False
    eng.llm.collective_rpc = flip_once
    try:
        m = train_and_publish()
        assert flip_once.done and m["publish/resent_full"] == 1.0 and _same_bits(eng, policy)
        m = train_and_publish()  # and deltas go on from the full copy
        assert m["publish/delta"] == 1.0 and m["publish/resent_full"] == 0.0 and _same_bits(eng, policy)
    finally:
        eng.llm.collective_rpc = real


def test_an_engine_that_is_not_the_learner_stops_the_run_naming_the_version(engine):
    """Both checks fail where they should: a tensor changed inside the engine after the push (the
    exact fingerprint names it), and a learner that moved without a push (the probe)."""
    from transformers import AutoModelForCausalLM

    from hindsight.transport.vllm import EngineWeightsDiffer

    eng, init = engine
    policy = AutoModelForCausalLM.from_pretrained(init)
    eng.load_weights(policy)
    eng.llm.collective_rpc("tamper", args=("model.norm.weight",))
    with pytest.raises(EngineWeightsDiffer, match=rf"weights version {eng.version}: .*model\.norm\.weight"):
        eng.sender.verify(eng.version, policy)
    eng.sender.publication.held = None  # the next push goes whole (a delta would not touch the norm): it heals
    eng.load_weights(policy)
    with torch.no_grad():  # the learner moves and nothing is pushed
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    with pytest.raises(EngineWeightsDiffer, match=rf"weights version {eng.version}: .*probe differ"):
        eng.sender.verify(eng.version, policy)
    assert eng.load_weights(policy)["publish/probe_gap"] < 0.3  # pushed: equal again


def test_a_lora_policy_goes_merged_and_the_engine_samples_it(engine):
    """A peft policy whose adapter moved: the engine gets the merged weights, passes the probe
    against the adapter model's own forward, and its greedy answer follows the adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    eng, init = engine
    tok = AutoTokenizer.from_pretrained(init)
    base = AutoModelForCausalLM.from_pretrained(init)
    eng.load_weights(base)
    prompt = "Ann has 3 pens and gets 4 more."
    greedy = lambda: eng.generate(tok, [prompt], 1, 6, 0.0, 1.0, seed=0).completion_ids[0].tolist()  # noqa: E731
    before = greedy()
    policy = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"]))
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    m = eng.load_weights(policy)
    assert m["publish/probe_gap"] < 0.3 and not any("lora" in k for k in _held(eng))
    assert greedy() != before
