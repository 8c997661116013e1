"""Logits never held whole (`hindsight.maths.logprobs.hidden_out`): the log-probs, entropies, a loss
with signal and its gradients equal the whole-logits path's to float32 round-off, on every path
a micro-batch takes (plain, shared prompt, packed), with chunks that split rows; a model that
changes its logits after the output layer (Gemma 2's soft-capping) keeps the whole path."""
import pytest
import torch

import hindsight.maths.logprobs as lp
from hindsight.maths.logprobs import micro_logprobs
from hindsight.models.load import load_causal_lm
from hindsight.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = load_causal_lm(str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "m")))
    model.train()
    return model


def _batch(vocab: int, group: int = 2):
    """Two groups of `group` rows, each group one left-padded prompt (P=5), right-padded completions (T=7)."""
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(4, vocab, (2, 5), generator=gen).repeat_interleave(group, 0)        # (B, 5)
    completions = torch.randint(4, vocab, (2 * group, 7), generator=gen)                       # (B, 7)
    mask = torch.ones(2 * group, 12, dtype=torch.long)
    mask[::group, 0] = 0                                  # left padding in each group's prompt
    mask[:, 0] = mask[::group, 0].repeat_interleave(group)
    mask[1, -3:] = 0                                      # a short completion
    return torch.cat([prompts, completions], 1), mask                                           # (B, 12) each


def _step(model, packing: str, group: int, chunk: int, monkeypatch):
    """logp, entropy, a policy-gradient loss with an entropy bonus, and every parameter's gradient."""
    monkeypatch.setattr(lp, "LOGIT_CHUNK", chunk)
    model.zero_grad(set_to_none=True)
    ids, mask = _batch(model.config.vocab_size, group)
    logp, entropy = micro_logprobs(model, ids, mask, 7, group, temperature=0.7, with_entropy=True, packing=packing)
    keep = mask[:, 5:].float()                                                                 # (B, 7)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[: ids.size(0), None]                    # signal
    loss = -((logp * advantages + 0.01 * entropy) * keep).sum() / keep.sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), entropy.detach(), loss.detach(), grads


@pytest.mark.parametrize("packing,group", [("off", 1), ("off", 2), ("on", 2)], ids=["plain", "shared-prompt", "packed"])
def test_chunked_logits_equal_whole_logits(tiny, packing, group, monkeypatch):
    whole = _step(tiny, packing, group, 0, monkeypatch)
    chunked = _step(tiny, packing, group, 5, monkeypatch)  # 5 positions a chunk: chunks split the rows
    assert getattr(tiny, lp._CHUNK_EXACT) is True  # the chunked path did run
    for a, b in zip(whole[:3], chunked[:3]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert whole[3].keys() == chunked[3].keys()
    assert any(g.abs().sum() > 0 for g in whole[3].values())  # a step whose gradient is not zero
    for name in whole[3]:
        torch.testing.assert_close(whole[3][name], chunked[3][name], rtol=1e-4, atol=1e-6, msg=name)


def test_no_grad_forwards_chunk_too_and_the_head_is_restored(tiny, monkeypatch):
    monkeypatch.setattr(lp, "LOGIT_CHUNK", 3)
    head = tiny.get_output_embeddings()
    ids, mask = _batch(tiny.config.vocab_size)
    with torch.no_grad():
        chunked, _ = micro_logprobs(tiny, ids, mask, 7, 2)
        monkeypatch.setattr(lp, "LOGIT_CHUNK", 0)
        whole, _ = micro_logprobs(tiny, ids, mask, 7, 2)
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-6)
    assert tiny.get_output_embeddings() is head


def test_a_model_that_soft_caps_its_logits_keeps_the_whole_path(monkeypatch):
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    model = Gemma2ForCausalLM(Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                           final_logit_softcapping=0.5))  # caps every logit to +-0.5
    with lp.hidden_out(model) as head:
        assert head is None
    assert getattr(model, lp._CHUNK_EXACT) is False
    ids = torch.randint(0, 64, (2, 6))
    logp, _ = micro_logprobs(model, ids, torch.ones_like(ids), 3, 1)
    assert torch.isfinite(logp).all() and logp.shape == (2, 3)
