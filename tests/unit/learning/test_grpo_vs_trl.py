"""Our GRPO maths against hand-computed values and against TRL 1.16's own loss code."""
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from hindsight.config.legacy import AGGREGATION_LOSS
from trl.trainer.grpo_trainer import GRPOTrainer

from hindsight.learning.algorithms.advantages import grpo_advantages, has_signal
from tests.unit.learning.trl_reference import Accelerator
from hindsight.learning.losses.objective import Objective, aggregate, policy_loss
from hindsight.learning.terms import kl_estimate


def test_grpo_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    adv = grpo_advantages(rewards, group_size=4, scale="group")
    # group 1: mean 0.5, unbiased std sqrt(1/3) = 0.57735
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5]) / (0.5773503 + 1e-4)
    assert torch.allclose(adv[:4], expected, atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(4))  # a constant group carries no signal
    assert [has_signal(g) for g in rewards.view(-1, 4).tolist()] == [True, False]


def test_grpo_advantages_batch_and_none_scaling():
    rewards = torch.tensor([1.0, 0.0, 3.0, 1.0])
    none = grpo_advantages(rewards, 2, "none")
    assert torch.allclose(none, torch.tensor([0.5, -0.5, 1.0, -1.0]))
    batch = grpo_advantages(rewards, 2, "batch")
    assert torch.allclose(batch, none / (rewards.std() + 1e-4))


def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([[-1.0]]), torch.tensor([[-2.0]])
    d = -1.0  # log(ref/pi)
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_estimate(logp, ref, "k2").item() == pytest.approx(0.5)
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(torch.exp(torch.tensor(d)).item() - d - 1)


def test_aggregations_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(loss, mask, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(loss, mask, "seq_mean_token_sum_norm", max_len=5).item() == pytest.approx(10 / (2 * 5))


def test_clipping_hand_computed():
    logp = torch.log(torch.tensor([[1.5, 0.5]]))  # ratios 1.5 and 0.5 against old logp 0
    old = torch.zeros(1, 2)
    s = Objective.named("dapo", clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.0)
    loss_pos, st = policy_loss(logp, old, None, torch.tensor([1.0]), torch.ones(1, 2), s)
    # A>0: min(1.5, 1.28) and min(0.5, 0.8) -> -(1.28 + 0.5)/2
    assert loss_pos.item() == pytest.approx(-(1.28 + 0.5) / 2, abs=1e-6)
    assert st["clip_fraction"] == pytest.approx(0.5)
    loss_neg, _ = policy_loss(logp, old, None, torch.tensor([-1.0]), torch.ones(1, 2), s)
    # A<0: min(-1.5, -1.28) = -1.5 ; min(-0.5, -0.8) = -0.8 -> loss = (1.5 + 0.8)/2
    assert loss_neg.item() == pytest.approx((1.5 + 0.8) / 2, abs=1e-6)


def _trl_loss(loss_type, logp, old, ref, adv, mask, beta, eps_low, eps_high, max_len, grad_accum=1,
              steps_per_generation=1, items=None, tool_mask=None):
    """Run TRL's GRPOTrainer._compute_loss on given tensors: only the model call is replaced."""
    fake = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
        beta=beta, loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False,
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=steps_per_generation),
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=grad_accum, max_completion_length=max_len, _entropy_bonus_enabled=False,
        aux_loss_enabled=False, accelerator=Accelerator(), _metrics=defaultdict(lambda: defaultdict(list)),
    )
    inputs = {"prompt_ids": torch.zeros(logp.size(0), 2, dtype=torch.long), "prompt_mask": torch.ones(logp.size(0), 2),
              "completion_ids": torch.zeros_like(mask, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": (mask if tool_mask is None else mask * tool_mask).sum() if items is None else items}
    if tool_mask is not None:
        inputs["tool_mask"] = tool_mask
    return GRPOTrainer._compute_loss(fake, None, inputs)


@pytest.mark.parametrize("ours,theirs", [("seq_mean_token_mean", "grpo"), ("token_mean", "bnpo"),
                                         ("token_mean", "dapo"), ("seq_mean_token_sum_norm", "dr_grpo")])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_and_gradients_match_trl(ours, theirs, beta):
    g = torch.Generator().manual_seed(7)
    B, T = 6, 5
    base = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    old = base + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios far enough to clip
    ref = base + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.25).double()
    mask[:, 0] = 1
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    adv = grpo_advantages(rewards, group_size=3)

    lp_ours = base.clone().requires_grad_(True)
    s = Objective.named(AGGREGATION_LOSS[ours], clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=beta, kl_estimator="k3", max_len=T)
    loss_ours, _ = policy_loss(lp_ours, old, ref, adv, mask, s)
    loss_ours.backward()

    lp_trl = base.clone().requires_grad_(True)
    loss_trl = _trl_loss(theirs, lp_trl, old, ref, adv, mask, beta, 0.2, 0.28, T)
    loss_trl.backward()

    assert abs(loss_ours.item() - loss_trl.item()) < 1e-6
    assert torch.allclose(lp_ours.grad, lp_trl.grad, atol=1e-6)
    assert lp_ours.grad.abs().sum() > 0  # the comparison is not vacuous


@pytest.mark.parametrize("ours,theirs", [("seq_mean_token_mean", "grpo"), ("seq_mean_token_sum_norm", "dr_grpo"),
                                         ("token_mean", "dapo")])
def test_mini_batches_match_trl_steps_per_generation_and_gradient_accumulation(ours, theirs):
    """TRL: a generation batch of 12 is cut into steps_per_generation = 4 calls of
    per_device_train_batch_size = 3, and gradient_accumulation_steps = 2 calls make an optimizer
    step. Ours: mini_batch_size 6 (= 3 x 2), each mini-batch in micro-batches of 3 rows. Each
    optimizer step's loss and gradients agree. TRL's dapo divides by the generation batch's
    tokens per accumulation window, ours by the mini-batch's own: equal when the mini-batches
    hold as many tokens, as here (docs/fitting.md states the difference)."""
    from hindsight.learning.batching import Totals, mini_batches

    g = torch.Generator().manual_seed(11)
    B, T, per_device, accum, spg = 12, 5, 3, 2, 4
    base = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    old = base + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = base + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) > 0.3).double()
    mask[:, 0] = 1
    mask[6:] = mask[:6].flip(0)  # both mini-batches hold the same number of tokens
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 2.0, 1.0, 0.0, 0.0, 1.0, 0.5],
                                       dtype=torch.float64), group_size=3)
    s = Objective.named(AGGREGATION_LOSS[ours], clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.04, kl_estimator="k3", max_len=T)
    minis = mini_batches(B, 3, per_device * accum)
    assert minis == [list(range(6)), list(range(6, 12))]
    for rows in minis:
        totals = Totals.of(mask[rows])
        lp_ours, lp_trl = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
        ours_total = trl_total = 0.0
        for at in range(rows[0], rows[-1] + 1, per_device):
            r = list(range(at, at + per_device))
            loss, _ = policy_loss(lp_ours[r], old[r], ref[r], adv[r], mask[r], s, totals=totals)
            loss.backward()
            ours_total += loss.item()
            theirs_loss = _trl_loss(theirs, lp_trl[r], old[r], ref[r], adv[r], mask[r], 0.04, 0.2, 0.28, T,
                                    grad_accum=accum, steps_per_generation=spg, items=mask.sum())
            theirs_loss.backward()
            trl_total += theirs_loss.item()
        assert abs(ours_total - trl_total) < 1e-9
        assert torch.allclose(lp_ours.grad, lp_trl.grad, atol=1e-9)
        assert lp_ours.grad[rows].abs().sum() > 0 and lp_ours.grad[[i for i in range(B) if i not in rows]].abs().sum() == 0


@pytest.mark.parametrize("ours,theirs", [("seq_mean_token_mean", "grpo"), ("token_mean", "dapo"),
                                         ("seq_mean_token_sum_norm", "dr_grpo")])
def test_multi_turn_loss_and_gradients_match_trl_with_its_tool_mask(ours, theirs):
    """A multi-turn batch: TRL's GRPOTrainer trains on completion_mask * tool_mask (tool results
    0); ours on completion_mask * action_mask. The loss and gradients agree, and the gradient at
    every tool token is exactly zero."""
    from hindsight.maths.experience import Experience

    g = torch.Generator().manual_seed(5)
    B, T = 6, 9
    base = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    old = base + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)
    ref = base + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    attend = torch.ones(B, T, dtype=torch.float64)
    attend[:, 7:] = torch.tensor([[1, 1], [0, 0], [1, 0], [1, 1], [0, 0], [1, 0]], dtype=torch.float64)
    tool = torch.ones(B, T, dtype=torch.float64)
    tool[:, 2:5] = 0  # a tool's reply between two model turns
    tool[3, 2:7] = 0
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64), group_size=3)
    exp = Experience(torch.zeros(B, 2, dtype=torch.long), torch.ones(B, 2), torch.zeros(B, T, dtype=torch.long),
                     attend, old, 3, action_mask=tool)

    lp_ours = base.clone().requires_grad_(True)
    s = Objective.named(AGGREGATION_LOSS[ours], clip_eps_low=0.2, clip_eps_high=0.28, kl_coef=0.04, kl_estimator="k3", max_len=T)
    loss_ours, _ = policy_loss(lp_ours, old, ref, adv, exp.loss_mask, s)
    loss_ours.backward()

    lp_trl = base.clone().requires_grad_(True)
    fake_inputs_mask = attend
    loss_trl = _trl_loss(theirs, lp_trl, old, ref, adv, fake_inputs_mask, 0.04, 0.2, 0.28, T, tool_mask=tool)
    loss_trl.backward()

    assert abs(loss_ours.item() - loss_trl.item()) < 1e-6
    assert torch.allclose(lp_ours.grad, lp_trl.grad, atol=1e-6)
    assert lp_ours.grad[(attend * (1 - tool)).bool()].abs().max() == 0
    assert lp_ours.grad[exp.loss_mask.bool()].abs().sum() > 0
