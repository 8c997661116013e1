"""The policy's float32 decode with its large linears prepacked for oneDNN (`rollout.prepacked`):
F.linear's numbers to float32 round-off, only while no gradient is recorded, gone after the call;
a decode through them is bit-reproducible for a seed and samples what the plain decode samples."""
import pytest
import torch

from hindsight.maths.experience import pad_left
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.models.tiny import build_tiny_model
from hindsight.rollout import prepacked
from hindsight.rollout.hf import decode
from hindsight.rollout.prepacked import packable, prepacked_linears, works_here

pytestmark = pytest.mark.skipif(not works_here(), reason="this torch build has no oneDNN float32 prepacked matmul: "
                                "linears run as they are (the decode tests in test_sampler.py)")


def test_a_large_linear_runs_packed_inside_and_as_it_was_after():
    torch.manual_seed(0)
    layer = torch.nn.Linear(256, 1024)                                          # 262,144 weights: packs
    x = torch.randn(16, 1, 256)                                                 # (B, 1, in)
    want = torch.nn.functional.linear(x, layer.weight, layer.bias)              # (B, 1, out)
    with prepacked_linears(layer):
        assert "forward" in layer.__dict__
        with torch.no_grad():
            got = layer(x)
        with_grad = layer(x)  # a gradient is recorded: F.linear, bit for bit
    assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(with_grad, want) and with_grad.requires_grad
    assert "forward" not in layer.__dict__ and torch.equal(layer(x), want)


def test_only_plain_large_float32_linears_pack():
    assert packable(torch.nn.Linear(256, 1024))
    assert not packable(torch.nn.Linear(64, 256))                               # too small to gain
    assert not packable(torch.nn.Linear(256, 1024).bfloat16())

    class Subclass(torch.nn.Linear):  # a LoRA or quantized layer has its own forward
        pass

    assert not packable(Subclass(256, 1024))
    hooked = torch.nn.Linear(256, 1024)
    hooked.forward = lambda x: x  # an offloading hook's own forward: left to it
    assert not packable(hooked)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(build_tiny_model(tmp_path_factory.mktemp("m") / "m", hidden=64, layers=2, heads=4))
    return load_causal_lm(path).eval(), load_tokenizer(path)


def _decode(model, tok, seed: int, prepack: bool):
    seqs = [tok(p, add_special_tokens=False)["input_ids"] for p in ("Q: 12+7+5= A: ", "Ann has 40 pens and")]
    ids, mask = pad_left(seqs, tok.pad_token_id)                                # (2, L)
    gens = [torch.Generator().manual_seed(seed + g) for g in range(2)]
    return decode(model, ids, mask, gens, 3, 12, 1.0, 1.0, [], tok.pad_token_id, with_logprobs=True, prepack=prepack)


def test_a_packed_decode_is_reproducible_and_samples_what_the_plain_one_does(tiny, monkeypatch):
    model, tok = tiny
    monkeypatch.setattr(prepacked, "MIN_ELEMENTS", 1)  # the tiny model's linears are small: pack them all
    calls = []
    real = prepacked.PackedLinear.forward
    monkeypatch.setattr(prepacked.PackedLinear, "forward", lambda self, x: calls.append(1) or real(self, x))
    ids_a, _, logp_a = _decode(model, tok, seed=5, prepack=True)
    assert len(calls) >= 12 * 2 * 7  # every position through every layer's seven linears ran packed
    ids_b, _, logp_b = _decode(model, tok, seed=5, prepack=True)
    assert torch.equal(ids_a, ids_b) and torch.equal(logp_a, logp_b)          # bit for bit, for a seed
    ids_p, _, logp_p = _decode(model, tok, seed=5, prepack=False)
    assert torch.equal(ids_a, ids_p) and torch.allclose(logp_a, logp_p, atol=1e-5)  # round-off apart
    assert not any("forward" in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("prepack", [True, False])
def test_the_hf_engine_packs_as_rl_rollout_hf_prepack_says(tiny, monkeypatch, prepack):
    from hindsight.config import PipelineConfig
    from hindsight.rollout.engines import EngineContext, get_engine

    model, tok = tiny
    monkeypatch.setattr(prepacked, "MIN_ELEMENTS", 1)
    packs = []
    real = prepacked.PackedLinear.__init__
    monkeypatch.setattr(prepacked.PackedLinear, "__init__", lambda self, *a: packs.append(1) or real(self, *a))
    cfg = PipelineConfig.model_validate({"data": {"dir": "d", "dvc_file": None, "build_demo": False},
                                         "rl": {"rollout": {"max_new_tokens": 6, "hf": {"prepack": prepack}}}})
    engine = get_engine("hf")(EngineContext(policy=model, tok=tok, rollout=cfg.rl.rollout,
                                            settings=cfg.rl.rollout.engine_settings(), seed=0, init_path="",
                                            bucket_mb=64, budget=None, stop_ids=(tok.eos_token_id,)))
    exp = engine.sample(["Q: 12+7+5= A: "], [5], 2)
    assert exp.completion_ids.shape[0] == 2
    assert (len(packs) > 0) == prepack  # one pack per linear for the call, or none
