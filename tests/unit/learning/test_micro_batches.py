"""Micro-batches are an exact re-cut of the update: at any `micro_batch_tokens`, one optimizer
step lands on the parameters the whole-batch step lands on (GRPO and PPO with its critic, each
loss aggregation, with the KL term and the entropy bonus), because every micro-batch's loss is
divided by the whole mini-batch's denominators; and the cut itself keeps whole groups, sorts by
length and respects the budget."""
import copy

import pytest
import torch

from hindsight.config.legacy import AGGREGATION_LOSS

from hindsight.learning.algorithms.ppo import PPOSettings
from hindsight.maths.experience import micro_batches, trimmed
from hindsight.learning.batching import Totals, mini_batches
from hindsight.learning.update import LearnerSettings, update
from hindsight.learning.losses.objective import Objective, aggregate
from hindsight.models.load import load_causal_lm, load_reward_model, load_tokenizer
from hindsight.models.tiny import build_tiny_model
from hindsight.rollout.hf import sample_groups

from helpers import grads_at_step

PROMPTS = ["Ann has 40 pens and gets 13 more.", "Bob has 10 cats", "Cal finds 7 more keys now? A:", "Dee"]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    path = build_tiny_model(tmp_path_factory.mktemp("m") / "m", hidden=32, layers=2, heads=2)
    model, tok = load_causal_lm(str(path)), load_tokenizer(str(path))
    exp = sample_groups(model, tok, PROMPTS, [3] * len(PROMPTS), 4, 8)
    ends = torch.tensor([8, 3, 5, 2, 7, 8, 1, 4, 6, 2, 3, 8, 5, 5, 2, 7])  # as if each row met EOS there
    cut = torch.arange(8)[None, :] >= ends[:, None]                       # (B, T)
    exp.completion_mask[cut] = 0
    exp.completion_ids[cut] = tok.pad_token_id
    exp.logprobs[cut] = 0.0
    exp.ref_logprobs = (exp.logprobs + 0.3 * torch.randn(exp.logprobs.shape, generator=torch.Generator().manual_seed(5)))
    exp.ref_logprobs[cut] = 0.0  # the KL term's reference, padded as stored ones are
    exp.rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.0, 1.0, 0.0, 2.0, 0.0, 1.0, 0.0])
    lengths = exp.completion_mask.sum(-1)
    assert len(set(lengths.tolist())) > 2, "completions of one length would not test the padding"
    return str(path), tok.pad_token_id, exp


def _double(exp):
    """In float64, so the two cuts' rounding differences stay far below what is compared. They are
    not 1e-16: transformers builds the rotary tables in float32, and a group kept whole (one
    prompt forward) and cut into rows (one forward per row) then differ by ~5e-9 in a gradient.
    AdamW's first step is about lr * sign(g), which turns such a difference on a near-zero
    gradient into up to lr: hence lr 1e-4 below, and the gradients compared as well."""
    exp = copy.deepcopy(exp)
    for k, v in vars(exp).items():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            setattr(exp, k, v.double())
    return exp


def _train(path, pad_id, exp, algorithm, agg, budget, mini=None, lr=1e-4, packing="off", **objective):
    torch.manual_seed(0)
    model = load_causal_lm(path).double()
    critic = critic_opt = None
    params = None
    if algorithm == "ppo":
        critic = load_reward_model(path).double()
        critic.config.pad_token_id = pad_id
        critic_opt = torch.optim.AdamW(critic.parameters(), lr=lr, weight_decay=0.0)
        params = PPOSettings(critic_lr=lr)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    s = LearnerSettings(algorithm=algorithm, params=params, mini_batch_size=mini, micro_batch_tokens=budget,
                        packing=packing,
                        loss=Objective.named(AGGREGATION_LOSS.get(agg, agg), kl_coef=0.05,
                                             max_len=exp.completion_ids.size(1), entropy_coef=0.01, **objective))
    model.step_grads = grads_at_step(opt)  # the update frees its gradients after the step
    if critic is not None:
        critic.step_grads = grads_at_step(critic_opt)
    metrics = update(model, opt, _double(exp), s, critic, critic_opt)
    return model, critic, metrics


def _assert_same(a, b, atol=1e-6):
    """The parameters after the step, and the step's (last mini-batch's, clipped) gradients."""
    for (name, x), y in zip(a.named_parameters(), b.parameters()):
        assert torch.allclose(x, y, atol=atol), f"{name}: max |diff| {(x - y).abs().max():.2e}"
        gx, gy = a.step_grads[id(x)], b.step_grads[id(y)]
        assert torch.allclose(gx, gy, atol=1e-7), f"{name} grad: max |diff| {(gx - gy).abs().max():.2e}"


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_a_micro_batched_step_equals_the_whole_batch_step(batch, algorithm, agg):
    path, pad_id, exp = batch
    whole, whole_critic, m_whole = _train(path, pad_id, exp, algorithm, agg, None)
    assert m_whole["learn/micro_batches"] == 1
    moved = max((p - q).abs().max().item() for p, q in zip(whole.parameters(), load_causal_lm(path).double().parameters()))
    assert moved > 5e-5  # the step did something to compare: AdamW moved weights by about lr
    for budget in (1, 40, 90):
        micro, micro_critic, m = _train(path, pad_id, exp, algorithm, agg, budget)
        assert m["learn/micro_batches"] > 1
        _assert_same(micro, whole)
        if algorithm == "ppo":
            _assert_same(micro_critic, whole_critic)
            assert m["critic/loss"] == pytest.approx(m_whole["critic/loss"], rel=1e-5)
        assert m["loss"] == pytest.approx(m_whole["loss"], rel=1e-5, abs=1e-7)
        assert m["entropy"] == pytest.approx(m_whole["entropy"], rel=1e-5)


def _off_policy(exp):
    """The batch as an async or vLLM run stores it: behaviour log-probs of another policy (ratios
    far from 1, clips firing) and an engine's own, further off (the correction firing)."""
    exp = copy.deepcopy(exp)
    g = torch.Generator().manual_seed(11)
    m = exp.completion_mask.float()
    exp.logprobs = exp.logprobs + 0.6 * torch.randn(exp.logprobs.shape, generator=g) * m
    exp.engine_logprobs = exp.logprobs + 0.4 * torch.randn(exp.logprobs.shape, generator=g) * m
    return exp


@pytest.mark.parametrize("loss", ["gspo", "cispo", "sapo", "luspo"])
def test_the_new_losses_micro_batched_and_packed_equal_the_whole_batch(batch, loss):
    """A sequence-level ratio needs its whole sequence in one micro-batch, which the cut keeps;
    with the correction (sequence mask) and the off-policy sequence mask firing, every budget and
    packing give the whole batch's step."""
    from hindsight.learning.correction import Correction

    path, pad_id, exp = batch
    exp = _off_policy(exp)
    params = {"gspo": {"clip_eps_low": 0.1, "clip_eps_high": 0.1}, "luspo": {"clip_eps_low": 0.1, "clip_eps_high": 0.1},
              "cispo": {"clip_max": 1.2}}.get(loss, {})
    kw = dict(correction=Correction(level="sequence", action="mask", clip_max=3.0, clip_min=0.3, off_policy_mask=0.05),
              kl_bias_correction=True, **params)
    whole, _, m_whole = _train(path, pad_id, exp, "grpo", loss, None, **kw)
    assert m_whole["offpolicy/corrected_fraction"] > 0 and m_whole.get("clip_fraction", 1.0) > 0
    assert 0 < m_whole["offpolicy/weight_changed_fraction"] < 1  # the loss itself was corrected
    assert 0 < m_whole["offpolicy/sequence_masked_fraction"] < 1
    moved = max((p - q).abs().max().item() for p, q in zip(whole.parameters(), load_causal_lm(path).double().parameters()))
    assert moved > 5e-5
    for budget, packing in ((1, "off"), (40, "off"), (90, "on")):
        micro, _, m = _train(path, pad_id, exp, "grpo", loss, budget, packing=packing, **kw)
        assert m["learn/micro_batches"] > 1
        _assert_same(micro, whole)
        assert m["loss"] == pytest.approx(m_whole["loss"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_a_packed_step_equals_the_padded_step(batch, algorithm, agg):
    """Rows end to end (`rl.learner.packing: on`) against the padded forwards (the whole batch's
    shared-prompt forward, and micro-batches of rows): the same parameters and gradients, the
    critic's too, with the KL term and the entropy bonus."""
    path, pad_id, exp = batch
    for budget in (None, 90):
        padded, padded_critic, m_pad = _train(path, pad_id, exp, algorithm, agg, budget)
        packed, packed_critic, m = _train(path, pad_id, exp, algorithm, agg, budget, packing="on")
        assert (m["learn/packing"], m_pad["learn/packing"]) == (1.0, 0.0)
        _assert_same(packed, padded)
        if algorithm == "ppo":
            _assert_same(packed_critic, padded_critic)
            assert m["critic/loss"] == pytest.approx(m_pad["critic/loss"], rel=1e-6)
        for key in ("loss", "entropy", "kl", "ratio_mean"):
            assert m[key] == pytest.approx(m_pad[key], rel=1e-6, abs=1e-9), key


def test_mini_batches_step_once_each_and_micro_batches_do_not_change_them(batch):
    path, pad_id, exp = batch
    one, _, m1 = _train(path, pad_id, exp, "grpo", "token_mean", None, mini=None)
    two, _, m2 = _train(path, pad_id, exp, "grpo", "token_mean", None, mini=8)
    assert m1["learn/mini_batches"] == 1 and m2["learn/mini_batches"] == 2
    assert max((p - q).abs().max().item() for p, q in zip(one.parameters(), two.parameters())) > 5e-5
    cut, _, m3 = _train(path, pad_id, exp, "grpo", "token_mean", 30, mini=8)
    assert m3["learn/micro_batches"] > 1
    _assert_same(cut, two)


def test_the_cut_keeps_groups_whole_sorts_by_length_and_keeps_the_budget():
    assert mini_batches(12, 4, None) == [list(range(12))]
    assert mini_batches(12, 4, 8) == [list(range(8)), list(range(8, 12))]
    p = [3, 3, 3, 3, 9, 9, 9, 9]
    c = [1, 2, 2, 1, 6, 1, 1, 1]
    # group 1 (widest 9 + 6) is 60 tokens: over a budget of 40, so its rows are cut apart;
    # group 0 (4 x (3 + 2) = 20) fits whole
    parts = micro_batches(p, c, 4, 40)
    assert sorted(i for part in parts for i in part) == list(range(8))
    assert [0, 1, 2, 3] in parts
    assert parts[0] == [4] or 4 in parts[0]  # the longest row first
    for part in parts:
        width = max(p[i] for i in part) + max(c[i] for i in part)
        assert len(part) * width <= 40 or len(part) == 1
    assert micro_batches(p, c, 4, 1) == [[4], [5], [6], [7], [1], [2], [0], [3]]  # a row over budget is its own


def test_a_trimmed_micro_batch_keeps_only_the_columns_its_rows_use(batch):
    _, _, exp = batch
    short = [int(exp.completion_mask.sum(-1).argmin())]
    part = trimmed(exp, short)
    assert part.completion_ids.size(1) == int(exp.completion_mask[short].sum())
    assert part.prompt_ids.size(1) == int(exp.prompt_mask[short].sum())
    assert bool(part.prompt_mask.all()) and bool(part.completion_mask.all())


def test_micro_batch_losses_sum_to_the_whole_batch_loss_for_each_aggregation():
    g = torch.Generator().manual_seed(1)
    loss, mask = torch.rand(6, 5, generator=g), (torch.rand(6, 5, generator=g) > 0.3).float()
    mask[:, 0] = 1
    totals = Totals.of(mask)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        whole = aggregate(loss, mask, mode, 5)
        parts = sum(aggregate(loss[r], mask[r], mode, 5, totals) for r in ([0, 3], [1], [2, 4, 5]))
        assert parts.item() == pytest.approx(whole.item(), rel=1e-6), mode


def test_an_out_of_memory_micro_batch_is_redone_smaller_and_the_step_lands_where_it_would(batch, monkeypatch):
    """The first forward of the whole mini-batch (policy and critic) raises the device's
    OutOfMemoryError, as a GPU would: the mini-batch is redone in micro-batches of half its padded
    tokens, from zeroed gradients, and the step equals the one that never failed."""
    import hindsight.learning.update as upd

    path, pad_id, exp = batch
    unforced, unforced_critic, m0 = _train(path, pad_id, exp, "ppo", "token_mean", None)
    real_policy, real_critic = upd._policy_step, upd._critic_step
    failed = []

    def fails_once(real, what):
        def step(model, optimizer, mb, parts, *args, **kwargs):
            if what not in failed:
                failed.append(what)
                sum(p.sum() for p in model.parameters()).backward()  # a half-done backward leaves gradients
                raise torch.OutOfMemoryError(f"CUDA out of memory ({what}, forced)")
            return real(model, optimizer, mb, parts, *args, **kwargs)
        return step

    monkeypatch.setattr(upd, "_policy_step", fails_once(real_policy, "policy"))
    monkeypatch.setattr(upd, "_critic_step", fails_once(real_critic, "critic"))
    forced, forced_critic, m = _train(path, pad_id, exp, "ppo", "token_mean", None)
    assert failed == ["policy", "critic"] and m["learn/oom_retries"] == 2.0 and m["learn/micro_batches"] > 1
    _assert_same(forced, unforced)
    _assert_same(forced_critic, unforced_critic)
    assert m["loss"] == pytest.approx(m0["loss"], rel=1e-5, abs=1e-7)
