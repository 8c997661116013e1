"""Every advantage estimator and the PPO pieces against values worked out by hand."""
import math

import pytest
import torch

from hindsight.learning.algorithms import advantages as adv
from hindsight.learning.losses.objective import Objective, policy_loss
from hindsight.learning.terms import value_loss
from hindsight.learning.update import LearnerSettings, compute_advantages
from hindsight.maths.experience import Experience
from hindsight.coordination.replay import group_priority, pick_hard_examples, signal_groups


def test_rloo_leave_one_out_baseline():
    # group [1, 0, 0, 1]: completion 0's baseline is mean(0, 0, 1) = 1/3, so 1 - 1/3 = 2/3
    a = adv.rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 5.0]), 4)
    expected = [2 / 3, -2 / 3, -2 / 3, 2 / 3, -1.0, -1.0, -1.0, 3.0]
    torch.testing.assert_close(a, torch.tensor(expected), atol=1e-6, rtol=0)


def test_token_rewards_put_the_outcome_on_the_last_real_token_and_kl_everywhere():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 9.0]])
    r = adv.token_rewards(torch.tensor([1.0, 2.0]), mask, kl, kl_coef=0.5)
    torch.testing.assert_close(r, torch.tensor([[-0.05, -0.1, 0.85], [-0.25, 1.75, 0.0]]))


def test_discounted_returns():
    r = torch.tensor([[1.0, 0.0, 2.0]])
    torch.testing.assert_close(adv.discounted_returns(r, gamma=0.5), torch.tensor([[1.5, 1.0, 2.0]]))


def test_reinforce_pp_whitens_returns_over_the_batch():
    mask = torch.tensor([[1, 1], [1, 0]])
    a = adv.reinforce_pp_advantages(torch.tensor([1.0, 0.0]), mask, None, 0.0)
    # returns on real tokens: [1, 1] and [0]; mean 2/3, population std sqrt(2/9)
    mean, std = 2 / 3, math.sqrt(2 / 9)
    expected = torch.tensor([[(1 - mean) / std, (1 - mean) / std], [(0 - mean) / std, 0.0]])
    torch.testing.assert_close(a, expected, atol=1e-4, rtol=0)


def test_gae_by_hand():
    # one sequence, 3 tokens, reward 1 at the end, gamma 0.9, lam 0.5, values [0.5, 0.4, 0.2]
    values = torch.tensor([[0.5, 0.4, 0.2]])
    r = torch.tensor([[0.0, 0.0, 1.0]])
    a, ret = adv.gae(r, values, torch.ones(1, 3), gamma=0.9, lam=0.5)
    d2 = 1.0 - 0.2                    # last token: no next value
    d1 = 0.0 + 0.9 * 0.2 - 0.4
    d0 = 0.0 + 0.9 * 0.4 - 0.5
    a2, a1 = d2, d1 + 0.45 * d2
    a0 = d0 + 0.45 * a1
    torch.testing.assert_close(a, torch.tensor([[a0, a1, a2]]))
    torch.testing.assert_close(ret, torch.tensor([[a0 + 0.5, a1 + 0.4, a2 + 0.2]]))


def test_gae_ignores_padding():
    values = torch.tensor([[0.5, 0.4, 7.0]])
    a, _ = adv.gae(torch.tensor([[0.0, 1.0, 0.0]]), values, torch.tensor([[1, 1, 0]]), gamma=1.0, lam=1.0)
    torch.testing.assert_close(a, torch.tensor([[0.5, 0.6, 0.0]]))


def test_sequence_kl_penalty():
    out = adv.sequence_kl_penalty(torch.tensor([1.0]), torch.tensor([[0.2, 0.4, 5.0]]), torch.tensor([[1, 1, 0]]), 0.5)
    torch.testing.assert_close(out, torch.tensor([0.7]))


def test_value_loss_takes_the_worse_of_raw_and_clipped():
    v, old, ret = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 0.0]]), torch.tensor([[2.0, 0.5]])
    loss, frac = value_loss(v, old, ret, torch.ones(1, 2), clip=0.2)
    # token 0: raw (1-2)^2 = 1, clipped (0.2-2)^2 = 3.24 -> 3.24; token 1: both 0.25
    assert loss.item() == pytest.approx(0.5 * (3.24 + 0.25) / 2)
    assert frac == 0.5


def test_entropy_bonus_lowers_the_loss_by_coef_times_mean_entropy():
    logp = torch.tensor([[-1.0, -2.0]])
    ent = torch.tensor([[0.5, 1.5]])
    base, _ = policy_loss(logp, logp, None, torch.tensor([1.0]), torch.ones(1, 2), Objective())
    bonus, _ = policy_loss(logp, logp, None, torch.tensor([1.0]), torch.ones(1, 2), Objective(entropy_coef=0.1), ent)
    assert (base - bonus).item() == pytest.approx(0.1 * 1.0)


def _exp(rewards, mask, ref=None, logp=None):
    b, t = mask.shape
    e = Experience(torch.zeros(b, 1, dtype=torch.long), torch.ones(b, 1, dtype=torch.long),
                   torch.zeros(b, t, dtype=torch.long), mask, logp if logp is not None else torch.zeros(b, t), 2)
    e.rewards, e.ref_logprobs = torch.tensor(rewards), ref
    return e


def test_kl_in_reward_changes_grpo_rewards_not_the_loss():
    mask = torch.ones(2, 2, dtype=torch.long)
    ref = torch.tensor([[-1.0, -1.0], [0.0, 0.0]])  # k1 kl = logp - ref = [1, 1] and [0, 0]
    s = LearnerSettings(algorithm="rloo", reward_kl_coef=0.5, loss=Objective(kl_estimator="k1"))
    a, _ = compute_advantages(_exp([1.0, 1.0], mask, ref), s)
    # penalised rewards [1 - 0.5*2, 1 - 0] = [0, 1]; RLOO with 2 samples: [-1, 1]
    torch.testing.assert_close(a, torch.tensor([-1.0, 1.0]))


def test_signal_groups_keeps_the_first_groups_with_signal():
    kept, dropped = signal_groups([1, 1, 0, 1, 0, 0, 1, 0, 0, 1], 2, wanted=2)
    assert kept == [1, 3] and dropped == 2


def test_hard_examples_rank_by_reward_spread_and_disagreement():
    assert group_priority([1, 0, 1, 0], [0, 0, 0, 0], "reward_std") == pytest.approx(0.5)
    assert group_priority([1, 0], [-5.0, -1.0], "disagreement") == pytest.approx(1.0)  # confident in the wrong one
    rows = [{"group": g, "prompt_id": f"p{g}", "prompt": f"q{g}", "columns": '{"answer": "1"}', "step": 0,
             "logprobs": [0.0]} for g in (0, 0, 1, 1, 2, 2)]
    scores = [{"reward": r} for r in (1, 0, 1, 1, 1, 0.5)]
    picked = pick_hard_examples([(rows, scores)], 2, "reward_std", exclude=set())
    assert [p["id"] for p in picked] == ["p0", "p2"]  # p1 had no spread: never replayed
    assert picked[0] == {"answer": "1", "prompt": "q0", "id": "p0"}
    assert pick_hard_examples([(rows, scores)], 2, "reward_std", exclude={"p0"})[0]["id"] == "p2"
