"""The losses TRL does not ship, against their papers' equations computed by hand on small tensors:
GMPO's geometric-mean ratio, Clip-Cov's cut of high-covariance tokens, KL-Cov's penalty on them."""
import math

import pytest
import torch

from hindsight.learning.losses.objective import Objective, policy_loss


def test_gmpo_is_the_geometric_mean_of_sign_clipped_token_ratios():
    """One sequence, A = +1, log-ratios (0.1, 0.6, -0.5), eps 0.4. For A > 0 each token keeps
    min(log r, clip(log r)): 0.1, 0.4 (clipped above), -0.5 (below the low clip, but min keeps it);
    the ratio is exp(mean) = exp(0.0); loss -A * ratio. For A = -1: -min(-log r, -clip) keeps
    max(log r, clip(log r)): 0.1, 0.6, -0.4 -> exp(0.1)."""
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.6, -0.5], [0.1, 0.6, -0.5]], requires_grad=True)
    mask = torch.ones(2, 3)
    s = Objective.named("gmpo", clip_eps_low=0.4, clip_eps_high=0.4)
    loss, stats = policy_loss(logp, old, None, torch.tensor([1.0, -1.0]), mask, s)
    expected = (-1.0 * math.exp((0.1 + 0.4 - 0.5) / 3) + 1.0 * math.exp((0.1 + 0.6 - 0.4) / 3)) / 2
    assert float(loss) == pytest.approx(expected, abs=1e-6)
    loss.backward()
    # d/dlogp of -A exp(mean kept): only unclipped tokens pass gradient, each 1/3 of it
    g_pos = -1.0 * math.exp(0.0) / 3 / 2
    g_neg = 1.0 * math.exp(0.1) / 3 / 2
    torch.testing.assert_close(logp.grad, torch.tensor([[g_pos, 0.0, g_pos], [g_neg, g_neg, 0.0]]))
    assert stats["clip_fraction"] == pytest.approx(4 / 6)  # 0.6 and -0.5 leave the log-space clip in both rows


def test_gmpo_refuses_a_token_level_estimator():
    from hindsight.config import PipelineConfig

    with pytest.raises(ValueError, match="gmpo scores whole sequences, and rl.algorithm: reinforce_pp"):
        PipelineConfig.model_validate({"rl": {"algorithm": "reinforce_pp", "learner": {"loss": "gmpo"}}})


def test_clip_cov_cuts_the_gradient_of_tokens_of_high_covariance():
    """Four tokens, ratio 1 (unclipped). A = (2, 2, -2, -2) over two sequences, log p = (0, -3,
    0, -3): mean A 0, mean log p -1.5; covariances (2*1.5, 2*-1.5, -2*1.5, -2*-1.5) = (3, -3,
    -3, 3). With bounds (1, 5) the candidates are tokens 0 and 3; a ratio of 0.5 cuts
    max(1, int(0.5 * 4)) = 2: both. Their loss and gradient are 0; the others keep -A r."""
    logp = torch.tensor([[0.0, -3.0], [0.0, -3.0]], requires_grad=True)
    adv = torch.tensor([[2.0, 2.0], [-2.0, -2.0]])
    mask = torch.ones(2, 2)
    s = Objective.named("clip_cov", clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=5.0)
    loss, stats = policy_loss(logp, logp.detach(), None, adv, mask, s)
    # kept tokens (0, 1) A = 2 and (1, 0) A = -2: (-2 + 2) / 4 tokens
    assert float(loss) == pytest.approx(0.0, abs=1e-7)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -0.5], [0.5, 0.0]]))
    assert stats["cov_cut_fraction"] == pytest.approx(0.5)


def test_clip_cov_draws_only_as_many_as_its_ratio():
    logp = torch.tensor([[0.0, -3.0], [0.0, -3.0]], requires_grad=True)
    adv = torch.tensor([[2.0, 2.0], [-2.0, -2.0]])
    s = Objective.named("clip_cov", clip_cov_ratio=0.25, seed=3)  # max(1, int(0.25 * 4)) = 1 of the 2 candidates
    _, stats = policy_loss(logp, logp.detach(), None, adv, torch.ones(2, 2), s)
    assert stats["cov_cut_fraction"] == pytest.approx(0.25)


def test_kl_cov_penalises_the_tokens_of_largest_covariance():
    """The same four tokens, log-ratio 0.2 on each (ratio e^0.2): covariances (3, -3, -3, 3); a
    ratio of 0.5 takes the top 2 (tokens 0 and 3), whose loss gains coef * |log r| = 0.5 * 0.2."""
    old = torch.tensor([[0.0, -3.0], [0.0, -3.0]])
    logp = (old + 0.2).requires_grad_(True)
    adv = torch.tensor([[2.0, 2.0], [-2.0, -2.0]])
    s = Objective.named("kl_cov", kl_cov_ratio=0.5, ppo_kl_coef=0.5)
    loss, stats = policy_loss(logp, old, None, adv, torch.ones(2, 2), s)
    r = math.exp(0.2)
    per_token = [-2 * r + 0.1, -2 * r, 2 * r, 2 * r + 0.1]
    assert float(loss) == pytest.approx(sum(per_token) / 4, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-2 * r + 0.5, -2 * r], [2 * r, 2 * r + 0.5]]) / 4)
    assert stats["kl_cov_fraction"] == pytest.approx(0.5)
