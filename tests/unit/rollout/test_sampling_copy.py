"""The bf16 sampling copy (`rl.rollout.hf.dtype: bfloat16`, `rollout.sampling_copy`): a cast of the
policy's current weights that leaves the policy alone, keeps tied weights tied and prepacked
linears equal to F.linear; its sampling is bit-reproducible for a seed; each call samples the
weights of that moment; the copy does not outlive the call; and its log-probs, the engine's
side, differ from the float32 anchor by a measured gap."""
import gc
import weakref

import pytest
import torch

from hindsight.config import PipelineConfig
from hindsight.learning.correction import Correction, gap_metrics
from hindsight.maths.logprobs import budgeted_logprobs
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.tiny import build_tiny_model
from hindsight.rollout.engines import EngineContext, get_engine
from hindsight.rollout.hf import sample_groups
from hindsight.rollout.sampling_copy import PackedLinear, SamplingCopy, build_copy, packs_linears

PROMPTS = ["Ann has 40 pens and gets 13 more. How many pens now? A: ", "Q: 12+7+5= A: "]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("m") / "m", hidden=64, layers=2, heads=4))
    return path, load_tokenizer(path)


def test_the_copy_is_a_cast_that_leaves_the_policy_alone(tiny):
    path, _ = tiny
    policy = load_causal_lm(path).eval()
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    out = build_copy(policy, torch.bfloat16)
    assert all(p.dtype == torch.float32 and torch.equal(p, before[n]) for n, p in policy.named_parameters())
    assert all(p.dtype == torch.bfloat16 and not p.requires_grad for p in out.parameters())
    assert not set(map(id, out.parameters())) & set(map(id, policy.parameters()))
    ids = torch.randint(4, policy.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full, half = policy(ids).logits, out(ids).logits.float()                       # (3, 11, V)
    assert half.dtype == torch.float32 and 0 < (full - half).abs().max() < 0.1 * full.abs().max()
    if policy.config.tie_word_embeddings and not packs_linears(torch.bfloat16, torch.device("cpu")):
        assert out.lm_head.weight is out.get_input_embeddings().weight


@pytest.mark.skipif(not packs_linears(torch.bfloat16, torch.device("cpu")), reason="oneDNN bf16 prepacking "
                    "unavailable on this CPU: the copy is a plain cast there (the test above)")
def test_prepacked_linears_give_f_linears_numbers(tiny):
    path, _ = tiny
    policy = load_causal_lm(path).eval()
    out = build_copy(policy, torch.bfloat16)
    packed = [m for m in out.modules() if isinstance(m, PackedLinear)]
    assert len(packed) == sum(isinstance(m, torch.nn.Linear) for m in policy.modules())
    src = policy.model.layers[0].mlp.up_proj
    x = torch.randn(5, 7, src.in_features).bfloat16()                                    # (5, 7, H)
    got = out.model.layers[0].mlp.up_proj(x)
    assert torch.equal(got, torch.nn.functional.linear(x, src.weight.bfloat16()))


def test_bf16_sampling_is_bit_reproducible_for_a_seed(tiny):
    path, tok = tiny
    policy = load_causal_lm(path)
    copy = SamplingCopy("bfloat16")
    runs = []
    for _ in range(2):
        with copy.sampling(policy) as model:
            runs.append(sample_groups(model, tok, PROMPTS, [5, 6], 4, 12, temperature=1.0, logprobs="decode"))
    a, b = runs
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.logprobs, b.logprobs)
    with copy.sampling(policy) as model:
        other = sample_groups(model, tok, PROMPTS, [7, 8], 4, 12, temperature=1.0, logprobs="decode")
    assert not torch.equal(a.completion_ids, other.completion_ids[:, :a.completion_ids.size(1)])


@pytest.mark.parametrize("native", [False, True])
def test_a_cpu_that_emulates_bf16_is_warned_of_once(tiny, native, monkeypatch, caplog):
    """Without bf16 matrix units (an AVX2 CPU) the copy decodes slower than float32: one warning
    that names the setting, at the first call; none where oneDNN does bf16."""
    from hindsight.rollout import sampling_copy

    path, _ = tiny
    policy = load_causal_lm(path)
    monkeypatch.setattr(sampling_copy, "_PACKS", native)
    copy = SamplingCopy("bfloat16")
    with caplog.at_level("WARNING", logger=sampling_copy.__name__):
        for _ in range(2):
            if native:  # the check alone: a prepacked build needs a CPU that has it
                copy.warn_if_slow(torch.device("cpu"))
            else:
                with copy.sampling(policy):
                    pass
    warned = [r.getMessage() for r in caplog.records if "rl.rollout.hf.dtype" in r.getMessage()]
    assert len(warned) == (0 if native else 1), warned


def test_each_call_samples_the_current_weights_and_keeps_no_copy(tiny):
    path, tok = tiny
    policy = load_causal_lm(path)
    copy = SamplingCopy("bfloat16")
    with copy.sampling(policy) as model:
        first = sample_groups(model, tok, PROMPTS, [5, 6], 4, 12, logprobs="decode")
        held = weakref.ref(model)
    del model  # this test's own name for it; the engine holds none past its call
    gc.collect()
    assert held() is None  # dropped: never alive beside the update
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.5 * torch.randn_like(p))  # a new weights version
    with copy.sampling(policy) as model:
        second = sample_groups(model, tok, PROMPTS, [5, 6], 4, 12, logprobs="decode")
    assert not torch.equal(first.logprobs, second.logprobs[:, :first.logprobs.size(1)])


def test_the_engine_samples_the_copy_and_its_gap_is_measured(tiny):
    path, tok = tiny
    cfg = PipelineConfig.model_validate({"data": {"dir": "d", "dvc_file": None, "build_demo": False},
                                         "rl": {"rollout": {"max_new_tokens": 12, "logprobs": "learner",
                                                            "hf": {"dtype": "bfloat16"}}}})
    engine_cls = get_engine("hf")
    assert engine_cls.recomputes(cfg.rl.rollout)  # so the correction's `auto` turns on
    policy = load_causal_lm(path)
    engine = engine_cls(EngineContext(policy=policy, tok=tok, rollout=cfg.rl.rollout,
                                      settings=cfg.rl.rollout.engine_settings(), seed=0, init_path=path,
                                      bucket_mb=64, budget=None, stop_ids=(tok.eos_token_id,)))
    exp = engine.sample(PROMPTS, [5, 6], 4)
    gc.collect()
    assert not any(isinstance(o, PackedLinear) for o in gc.get_objects())  # no copy past the call
    anchor = budgeted_logprobs(policy, exp, 1.0, None) * exp.completion_mask                 # (B, T) float32
    gap = gap_metrics(anchor, exp.logprobs, exp.completion_mask, Correction(level="sequence", clip_max=3.0))
    assert 0 < gap["offpolicy/mismatch_kl_k3"] < 0.05 and gap["offpolicy/max_token_gap"] > 0
    fp32 = sample_groups(policy, tok, PROMPTS, [5, 6], 4, 12, logprobs="decode")
    assert torch.allclose(fp32.logprobs, budgeted_logprobs(policy, fp32, 1.0, None) * fp32.completion_mask, atol=1e-5)


@pytest.mark.parametrize("rl,words", [
    ({"rollout": {"logprobs": "decode", "hf": {"dtype": "bfloat16"}}}, "anchor the ratio on the bfloat16 copy"),
    ({"rollout": {"hf": {"dtype": "float16"}}}, "dtype"),
    ({"lora": {"enabled": True}, "rollout": {"hf": {"dtype": "bfloat16"}}}, "LoRA policy samples itself"),
])
def test_a_copy_where_it_cannot_serve_is_one_error(rl, words):
    with pytest.raises(ValueError, match=words):
        PipelineConfig.model_validate({"data": {"dir": "d", "dvc_file": None, "build_demo": False}, "rl": rl})
