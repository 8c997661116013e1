"""The packed layout by hand (bins, restarting positions, the kept logits' positions), the gate's
choice, and packed log-probs against padded ones on a tiny model (the step's equality is
tests/unit/learning/test_micro_batches.py's)."""
import torch

from hindsight.maths.logprobs import micro_logprobs, packed_token_logprobs, packs, token_logprobs
from hindsight.models.load import load_causal_lm, load_reward_model
from hindsight.models.tiny import build_tiny_model
from hindsight.maths.packing import bins, pack, unpack, worth_packing
from hindsight.maths.scores import budgeted_scores, packed_sequence_scores, packs_scores, pooled_columns, sequence_scores


def test_bins_are_first_fit_decreasing_within_the_widest_row():
    assert bins([5, 2, 3, 5, 1], 5) == [[0], [3], [2, 1], [4]]
    assert bins([4, 4], 4) == [[0], [1]]  # equal lengths: nothing to gain
    assert bins([3], 2) == [[0]]  # a row wider than the capacity still gets a bin


def test_pack_lays_rows_end_to_end_with_positions_restarting():
    # two rows: prompt (left-padded, P=3) then completion (right-padded, T=3)
    ids = torch.tensor([[0, 7, 8, 1, 2, 0],     # prompt 7 8, completion 1 2
                        [4, 5, 6, 3, 0, 0]])    # prompt 4 5 6, completion 3
    mask = torch.tensor([[0, 1, 1, 1, 1, 0],
                         [1, 1, 1, 1, 0, 0]])
    p = pack(ids, mask, n_completion=3, pad_id=0)
    # lengths 4 and 4, capacity 4: one bin each; row 0 first (ties keep row order)
    assert p.input_ids.tolist() == [[7, 8, 1, 2], [4, 5, 6, 3]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    # the logits at the last prompt token predict completion token 0
    assert p.keep.tolist() == [[False, True, True, False], [False, False, True, False]]
    assert p.targets.tolist() == [1, 2, 3] and p.rows.tolist() == [0, 0, 1] and p.cols.tolist() == [0, 1, 0]
    out = unpack(torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64), p, (2, 3))
    assert out.tolist() == [[0.1, 0.2, 0.0], [0.3, 0.0, 0.0]]


def test_short_rows_share_a_bin_and_the_tail_is_a_sequence_of_its_own():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6], [0, 0, 7, 8, 0, 0], [0, 0, 9, 5, 0, 0]])
    mask = torch.tensor([[1] * 6, [0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0]])
    p = pack(ids, mask, n_completion=3)
    assert p.input_ids.tolist() == [[1, 2, 3, 4, 5, 6], [7, 8, 9, 5, 0, 0]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 0, 1, 0, 1]]
    assert p.targets.tolist() == [4, 5, 6, 8, 5]


def test_the_gate_packs_mixed_lengths_and_not_equal_ones():
    equal = torch.ones(8, 20, dtype=torch.long)
    assert not worth_packing(equal, 10)
    mixed = torch.ones(8, 20, dtype=torch.long)
    mixed[:6, 8:] = 0  # six rows of 8 tokens: in pairs, 5 bins of 20 instead of 8 rows (100 of 160)
    assert worth_packing(mixed, 10)
    # against the shared-prompt forward (a prompt once per group of 4: 2 x 10 + 8 x 10) they do not pay
    assert not worth_packing(mixed, 10, shared_prompt_rows=4)


def test_packed_logprobs_equal_padded_ones_at_every_real_token(tmp_path):
    torch.manual_seed(0)
    model = load_causal_lm(str(build_tiny_model(tmp_path / "m", hidden=32, layers=2, heads=2))).double()
    ids = torch.randint(3, 60, (5, 11))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0                 # left padding of prompts (P = 5)
    mask[1, :1] = 0
    mask[2, :3] = 0                 # rows of 8, 10, 3, 10, 5 real tokens (completions 6, 6, 1, 5, 0):
    mask[2, 6:] = 0                 # in bins of 10, [10] [10] [8] [5, 3]
    mask[3, 10:] = 0
    mask[4, 5:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    want, want_h = token_logprobs(model, ids, mask, 6, with_entropy=True)                     # (5, 6)
    got, got_h = packed_token_logprobs(model, ids, mask, 6, with_entropy=True)                # (5, 6)
    real = mask[:, 5:].bool()
    assert torch.allclose(got[real], want[real], atol=1e-10) and (got[~real] == 0).all()
    assert torch.allclose(got_h[real], want_h[real], atol=1e-10)
    assert packs(model, mask, 6, 1, "auto", ids)  # 40 positions instead of 55
    auto, _ = micro_logprobs(model, ids, mask, 6, 1, packing="auto")
    assert torch.equal(auto, got)


def _reward_model(tmp_path):
    torch.manual_seed(0)
    return load_reward_model(str(build_tiny_model(tmp_path / "m", hidden=32, layers=2, heads=2)), "float64").eval()


def test_packed_reward_model_scores_equal_padded_ones_and_pool_the_same_token(tmp_path):
    rm = _reward_model(tmp_path)
    pad = rm.config.pad_token_id
    ids = torch.randint(3, 60, (5, 11))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0                 # prompts left-padded (P = 5), completions right-padded: 8, 10, 3, 10, 5 real tokens
    mask[1, :1] = 0
    mask[2, :3] = 0
    mask[2, 6:] = 0
    mask[3, 10:] = 0
    mask[4, 5:] = 0
    ids = ids.masked_fill(mask == 0, pad)
    ids[1, 10] = pad                # an EOS that is the pad id: transformers pools the token before it, so must we
    assert pooled_columns(ids, pad).tolist() == [10, 9, 5, 9, 4]
    want = sequence_scores(rm, ids, mask)                                                      # (5,) padded
    got = packed_sequence_scores(rm, ids, mask)                                                # (5,)
    assert torch.allclose(got, want.to(got.dtype), atol=1e-10), (got, want)
    assert not torch.allclose(want[1:], want[:-1])  # the rows' scores differ: each row read its own position
    assert packs_scores(rm, ids, mask, "auto") and torch.equal(sequence_scores(rm, ids, mask, "auto"), got)


def test_reward_model_scores_stay_padded_where_packing_cannot_reproduce_them(tmp_path):
    rm = _reward_model(tmp_path)
    ids = torch.randint(3, 60, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6])
    # padding with a token that is not the model's pad id: transformers pools a padding position
    assert not packs_scores(rm, ids, mask, "on")
    assert not packs_scores(rm, torch.full((2, 6), 7), torch.ones(2, 6, dtype=torch.long), "auto")  # equal rows: no gain
    rm.config.pad_token_id = None
    assert not packs_scores(rm, ids.masked_fill(mask == 0, 0), mask, "on")


def test_budgeted_packed_scores_equal_padded_ones_over_micro_batches(tmp_path):
    from hindsight.maths.experience import experience_from_rows
    rm = _reward_model(tmp_path)
    pad = rm.config.pad_token_id
    g = torch.Generator().manual_seed(1)
    rows = [{"prompt_ids": torch.randint(3, 60, (int(4 + i // 4),), generator=g).tolist(),
             "completion_ids": torch.randint(3, 60, (int(1 + (7 * i) % 13),), generator=g).tolist(),
             "logprobs": [0.0] * int(1 + (7 * i) % 13)} for i in range(8)]
    exp = experience_from_rows(rows, pad, group_size=4)
    padded = budgeted_scores(rm, exp, budget=None)                                             # (8,)
    packed = budgeted_scores(rm, exp, budget=40, packing="on")                                 # (8,) in micro-batches
    assert torch.allclose(packed, padded, atol=1e-6)  # float32 out: the scorer stores float32
