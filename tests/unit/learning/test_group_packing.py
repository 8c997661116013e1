"""A group's completions packed after its one prompt equal the plain padded forward: log-probs,
entropies and gradients, on uneven lengths (0, 1 and full), left-padded prompts, both mask forms
and a GQA model; the cost gate keeps padded rows where packing would cost more."""
import pytest
import torch
from transformers import AutoModelForCausalLM

import hindsight.maths.logprobs as lp
from hindsight.maths.group_packing import completion_lengths, layout, worth_it
from hindsight.models.tiny import build_tiny_model, build_tiny_qwen2

G, P, T = 4, 9, 12
LENGTHS = [12, 3, 1, 7, 5, 5, 2, 12, 4, 9, 6, 0]  # three groups of four, one row empty


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def folder(request, tmp_path_factory):
    build = build_tiny_model if request.param == "llama" else build_tiny_qwen2
    return build(tmp_path_factory.mktemp(request.param) / "m")


def rows(vocab: int, lengths=LENGTHS, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b = len(lengths)
    prompts = torch.randint(3, vocab, (b // G, P), generator=g)                     # (B/G, P)
    pmask = torch.ones(b // G, P, dtype=torch.long)
    pmask[1, :3] = 0                                                                 # left padding
    pmask[2, :1] = 0
    cmask = (torch.arange(T)[None] < torch.tensor(lengths)[:, None]).long()          # (B, T)
    comps = torch.randint(3, vocab, (b, T), generator=g).masked_fill(cmask == 0, 0)
    ids = torch.cat([prompts.repeat_interleave(G, 0), comps], 1)                     # (B, P+T)
    mask = torch.cat([pmask.repeat_interleave(G, 0), cmask], 1)
    return ids, mask, cmask


def with_grads(model, fn, cmask):
    model.zero_grad()
    logp, ent = fn()
    weights = torch.linspace(-1.0, 2.0, cmask.size(0))[:, None]                      # a step with signal
    ((logp * weights + 0.1 * ent) * cmask).sum().backward()
    return logp.detach() * cmask, ent.detach() * cmask, {k: p.grad.clone() for k, p in model.named_parameters()}


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_packed_completions_equal_the_plain_padded_forward_with_gradients(folder, impl):
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation=impl).train()
    ids, mask, cmask = rows(model.config.vocab_size)
    assert lp._group_packed(model, ids, mask, T, G) is not None                      # the packed path is taken
    plain = with_grads(model, lambda: lp.token_logprobs(model, ids, mask, T, 0.7, True), cmask)
    packed = with_grads(model, lambda: lp.group_token_logprobs(model, ids, mask, T, G, 0.7, True), cmask)
    assert plain[0].abs().max() > 1.0 and plain[1].abs().max() > 1.0                 # nothing trivially zero
    torch.testing.assert_close(packed[0], plain[0], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(packed[1], plain[1], atol=1e-5, rtol=1e-5)
    assert max(g.abs().max() for g in plain[2].values()) > 1e-3
    for k, g in plain[2].items():
        torch.testing.assert_close(packed[2][k], g, atol=1e-5, rtol=1e-4, msg=k)


def test_the_layout_lays_each_groups_inputs_end_to_end_at_their_padded_positions():
    ids, mask, _ = rows(50)
    lengths = completion_lengths(mask, T)
    gp = layout(ids, mask, T, G, lengths)
    assert gp.input_ids.shape == (3, 4 + 4 + 1 + 11)                                 # widest: group 1, 20 inputs
    # group 1 (prompt 6 real tokens): row 4's 4 inputs at positions 6..9, then row 5's
    assert gp.position_ids[1, :8].tolist() == [6, 7, 8, 9, 6, 7, 8, 9]
    assert torch.equal(gp.input_ids[1, :4], ids[4, P:P + 4])
    # row 5's first input sees the 6 real prompt tokens and itself, not row 4's tokens
    seen = gp.allowed[1, 0, 4]
    assert seen[:P].tolist() == [False] * 3 + [True] * 6
    assert seen[P:].nonzero().flatten().tolist() == [4]
    assert gp.rows.tolist().count(11) == 0 and gp.rows.tolist().count(2) == 0       # lengths 0 and 1: no inputs


def test_equal_long_completions_in_a_large_group_stay_padded():
    # 16 completions of 512 tokens: a dense mask over 16 x 511 keys costs more than padded rows
    lengths = torch.full((16,), 512)
    assert not worth_it(lengths, 40, 512, 16, hidden=576, params_per_layer=3.5e6)
    uneven = torch.tensor([512] + [20] * 15)
    assert worth_it(uneven, 40, 512, 16, hidden=576, params_per_layer=3.5e6)


def test_a_completion_mask_with_a_hole_takes_the_padded_path(folder):
    model = AutoModelForCausalLM.from_pretrained(folder).train()
    ids, mask, _ = rows(model.config.vocab_size)
    mask[0, P + 2] = 0                                                               # not ones then zeros
    assert completion_lengths(mask, T) is None
    assert lp._group_packed(model, ids, mask, T, G) is None
