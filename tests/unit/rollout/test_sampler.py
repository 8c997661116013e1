"""Batched group sampling and the shared-prompt forward (issue 12, item 4)."""
import pytest
import torch

from hindsight.maths.logprobs import group_token_logprobs, shares_prompts, token_logprobs
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.rollout.hf import gumbel_noise, nucleus_logits, pick_tokens, sample_groups

PROMPTS = ["Ann has 40 pens and gets 13 more. How many pens now? A: ", "Q: 12+7+5= A: ", "Bob has 9 cats. A: "]


@pytest.fixture(scope="module")
def model(tiny_init):
    _, path = tiny_init
    return load_causal_lm(path), load_tokenizer(path)


def test_gumbel_max_samples_the_tempered_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]]).repeat(20000, 1)         # (N, V)
    gen = torch.Generator().manual_seed(0)
    picks = pick_tokens(logits, gumbel_noise([gen], 20000, 5), 0.7, 1.0)           # (N,)
    freq = torch.bincount(picks, minlength=5).float() / 20000
    expected = torch.softmax(logits[0] / 0.7, -1)
    assert torch.allclose(freq, expected, atol=0.01), (freq, expected)


def test_the_noise_is_each_groups_own_draw_bit_for_bit():
    """The in-place noise is the plain formula's bits: group i's rows are `torch.rand` from its own
    generator, then -log(-log u), so a seed's samples stay what they were."""
    noise = gumbel_noise([torch.Generator().manual_seed(s) for s in (3, 4, 5)], 2, 300)        # (6, V)
    plain = torch.cat([torch.rand((2, 300), generator=torch.Generator().manual_seed(s)) for s in (3, 4, 5)])
    assert torch.equal(noise, -torch.log(-torch.log(plain.clamp(1e-10, 1.0 - 1e-7))))
    assert not torch.equal(noise[:2], noise[2:4])  # each group its own stream


def test_top_p_keeps_the_nucleus_and_renormalises_inside_it():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = nucleus_logits(logits, 0.7)  # 0.5 + 0.3 reach 0.7: the first two tokens
    assert torch.isinf(kept[0, 2:]).all() and torch.isfinite(kept[0, :2]).all()
    gen = torch.Generator().manual_seed(1)
    picks = pick_tokens(logits.repeat(20000, 1), gumbel_noise([gen], 20000, 4), 1.0, 0.7)
    freq = torch.bincount(picks, minlength=4).float() / 20000
    assert freq[2:].sum() == 0 and abs(freq[0] - 0.5 / 0.8) < 0.01


def test_a_groups_samples_do_not_depend_on_its_batch(model):
    policy, tok = model
    alone = sample_groups(policy, tok, PROMPTS[1:2], [11], 4, 12)
    batch = sample_groups(policy, tok, PROMPTS, [10, 11, 12], 4, 12)
    t = alone.completion_ids.size(1)
    assert torch.equal(alone.completion_ids, batch.completion_ids[4:8, :t])
    assert (batch.completion_ids[4:8, t:] == tok.pad_token_id).all()
    other_seed = sample_groups(policy, tok, PROMPTS[1:2], [99], 4, 12)
    assert not torch.equal(alone.completion_ids, other_seed.completion_ids[:, :t])  # the seed matters


def test_sampled_logprobs_are_the_learners(model):
    policy, tok = model
    exp = sample_groups(policy, tok, PROMPTS, [1, 2, 3], 4, 10, temperature=0.8)
    full, _ = token_logprobs(policy, exp.input_ids, exp.attention_mask, exp.completion_ids.size(1), 0.8)
    mask = exp.completion_mask.bool()
    assert torch.allclose(exp.logprobs[mask], full[mask], atol=1e-5)
    assert (exp.completion_ids[~mask] == tok.pad_token_id).all()
    ends = exp.completion_mask.sum(-1) - 1                                         # (B,) last kept position
    ended = exp.completion_ids.gather(1, ends[:, None]).squeeze(1) == tok.eos_token_id
    assert (ended | (exp.completion_mask.sum(-1) == exp.completion_ids.size(1))).all()  # EOS, or ran to the end


@pytest.mark.parametrize("new_tokens", [1, 7])
def test_the_shared_prompt_forward_equals_the_full_one_with_gradients(model, new_tokens):
    policy, tok = model
    exp = sample_groups(policy, tok, PROMPTS, [4, 5, 6], 4, new_tokens)
    n = exp.completion_ids.size(1)
    assert shares_prompts(exp.input_ids, exp.attention_mask, n, 4)
    grads = []
    for fn in (lambda: token_logprobs(policy, exp.input_ids, exp.attention_mask, n, 0.9, True),
               lambda: group_token_logprobs(policy, exp.input_ids, exp.attention_mask, n, 4, 0.9, True)):
        policy.zero_grad()
        logp, ent = fn()
        ((logp + 0.1 * ent) * exp.completion_mask).sum().backward()
        grads.append((logp.detach(), ent.detach(), {k: p.grad.clone() for k, p in policy.named_parameters()}))
    (a, ea, ga), (b, eb, gb) = grads
    m = exp.completion_mask.bool()
    assert torch.allclose(a[m], b[m], atol=1e-5) and torch.allclose(ea[m], eb[m], atol=1e-5)
    for k in ga:
        assert torch.allclose(ga[k], gb[k], atol=1e-5, rtol=1e-4), k


def test_rows_that_do_not_share_prompts_take_the_plain_path(model):
    policy, tok = model
    exp = sample_groups(policy, tok, PROMPTS[:2], [1, 2], 2, 5)
    ids, mask = exp.input_ids[[0, 2, 1, 3]], exp.attention_mask[[0, 2, 1, 3]]     # groups now mix prompts
    n = exp.completion_ids.size(1)
    assert not shares_prompts(ids, mask, n, 2)
    a, _ = token_logprobs(policy, ids, mask, n)
    b, _ = group_token_logprobs(policy, ids, mask, n, 2)
    assert torch.equal(a, b)


def test_decode_time_logprobs_equal_the_forward_ones(model):
    policy, tok = model
    a = sample_groups(policy, tok, PROMPTS, [7, 8, 9], 4, 10, temperature=0.8, logprobs="forward")
    b = sample_groups(policy, tok, PROMPTS, [7, 8, 9], 4, 10, temperature=0.8, logprobs="decode")
    assert torch.equal(a.completion_ids, b.completion_ids)
    m = a.completion_mask.bool()
    assert torch.allclose(a.logprobs[m], b.logprobs[m], atol=1e-5) and (b.logprobs[~m] == 0).all()


def test_the_preallocated_cache_decodes_what_the_growing_one_does(model):
    """The KV cache written in place (`hf._Preallocated`) against transformers' concatenating one:
    the same tokens and the same decoding log-probs, groups of different lengths and ends included."""
    from hindsight.maths.experience import pad_left
    from hindsight.rollout.hf import decode

    policy, tok = model
    ids, mask = pad_left([tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS], tok.pad_token_id)
    runs = []
    for preallocated in (False, True):
        gens = [torch.Generator().manual_seed(s) for s in (7, 8, 9)]
        runs.append(decode(policy.eval(), ids, mask, gens, 4, 12, 0.9, 1.0, [tok.eos_token_id], tok.pad_token_id,
                           with_logprobs=True, preallocated=preallocated))
    (grown, grown_mask, grown_logp), (placed, placed_mask, placed_logp) = runs
    assert grown.shape[1] > 1 and torch.equal(grown, placed) and torch.equal(grown_mask, placed_mask)
    torch.testing.assert_close(placed_logp, grown_logp, rtol=0, atol=1e-6)
    from hindsight.maths.logprobs import output_cache
    from hindsight.rollout.hf import _Preallocated, preallocate

    cache = output_cache(policy(input_ids=ids, attention_mask=mask, use_cache=True))
    preallocate(cache, 12)
    assert cache.layers and all(isinstance(layer, _Preallocated) and layer._k.shape[2] == ids.shape[1] + 12
                                for layer in cache.layers)
