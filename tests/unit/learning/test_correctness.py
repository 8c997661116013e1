"""Defects an outside review of the RL maths found (issue 13): each test failed before its fix."""
import math

import torch

from helpers import rl_cfg, tiny_init
from hindsight.learning.losses.objective import Objective, policy_loss
from hindsight.learning.terms import kl_estimate


def test_k3_kl_stays_finite_on_padding_with_a_very_unlikely_pad_token():
    """Reference log-probs are padded with 0.0; a pad position whose log-prob is far below
    -89 made exp(ref - logp) overflow, and inf * mask 0 turned the loss and grads into NaN."""
    logp = torch.tensor([[-0.5, -1.0, -120.0]], requires_grad=True)  # (1, 3): last position is padding
    ref = torch.tensor([[-0.7, -0.9, 0.0]])                            # padded with 0.0
    mask = torch.tensor([[1, 1, 0]])
    s = Objective(kl_coef=0.1, kl_estimator="k3")
    loss, stats = policy_loss(logp, logp.detach(), ref, torch.tensor([1.0]), mask, s)
    loss.backward()
    assert math.isfinite(float(loss)) and torch.isfinite(logp.grad).all()
    # the real tokens' KL is untouched: k3 = exp(r) - r - 1 with r = ref - logp
    r = torch.tensor([-0.2, 0.1])
    assert abs(stats["kl"] - float((r.exp() - r - 1).mean())) < 1e-6


def test_kl_log_ratio_is_clamped_like_verl_and_openrlhf():
    logp, ref = torch.tensor([[-60.0]]), torch.tensor([[0.0]])
    assert torch.isfinite(kl_estimate(logp, ref, "k3")).all()
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), torch.tensor([[math.exp(20) - 21]]))
    torch.testing.assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([[-20.0]]))




def test_dropout_is_off_in_rl_so_the_first_ratio_is_one(tmp_path):
    from hindsight.coordination.run import RLRun

    init = tiny_init(tmp_path, attention_dropout=0.9)
    run = RLRun(rl_cfg(tmp_path), init, None)
    run.rollout(0), run.score(0)
    assert abs(run.update(0)["ratio_mean/iter0"] - 1.0) < 1e-5
    run.close()


def test_dropout_can_be_kept_on_by_choice(tmp_path):
    from hindsight.coordination.run import RLRun

    init = tiny_init(tmp_path, attention_dropout=0.9)
    run = RLRun(rl_cfg(tmp_path, learner={"disable_dropout": False}), init, None)
    run.rollout(0), run.score(0)
    assert abs(run.update(0)["ratio_mean/iter0"] - 1.0) > 1e-5  # the opt-out really keeps dropout
    run.close()


def test_dual_clip_caps_the_loss_of_a_negative_advantage_at_clip_ratio_c():
    """verl's dual-clip: for A < 0 the loss is min(-A * c, max(-A r, -A clip(r))). Here A = -1,
    r = 5, eps 0.2, c = 3: the plain clipped loss is max(5, 0.8) = 5, the dual-clipped one 3,
    and its gradient is 0. A positive advantage is not touched."""
    logp = torch.log(torch.tensor([[5.0], [5.0]])).requires_grad_()  # (2, 1); old_logp 0 -> ratio 5
    old, mask, adv = torch.zeros(2, 1), torch.ones(2, 1), torch.tensor([-1.0, 1.0])
    plain, _ = policy_loss(logp, old, None, adv, mask, Objective.named("dapo"))
    dual, stats = policy_loss(logp, old, None, adv, mask, Objective.named("dapo", clip_ratio_c=3.0))
    # token losses: plain [5, -1.2], dual [3, -1.2]; token_mean over 2 tokens
    assert abs(float(plain) - (5.0 - 1.2) / 2) < 1e-5 and abs(float(dual) - (3.0 - 1.2) / 2) < 1e-5
    dual.backward()
    assert logp.grad.tolist() == [[0.0], [0.0]]  # capped for A<0, clipped (r > 1 + eps) for A>0
    assert stats["dual_clip_fraction"] == 0.5


def test_entropy_bonus_is_the_mean_token_entropy_whatever_the_loss():
    """Two sequences of 1 and 3 tokens, zero advantages, so the loss is -coef * mean token entropy,
    the same for every loss's reduction (TRL's definition: entropy_coef means one thing)."""
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    ent = torch.tensor([[3.0, 9.0, 9.0], [1.0, 2.0, 3.0]])  # padding entropies must not count
    for loss_name in ("dapo", "grpo", "dr_grpo", "luspo", "sapo"):
        loss, _ = policy_loss(logp, logp, None, torch.zeros(2), mask, Objective.named(loss_name, entropy_coef=0.1), ent)
        assert abs(float(loss) + 0.1 * (3 + 1 + 2 + 3) / 4) < 1e-6, loss_name


def test_resume_restores_the_saved_rng_state(tmp_path):
    import random

    from hindsight.coordination.run import RLRun

    init = tiny_init(tmp_path)
    cfg = rl_cfg(tmp_path, save_every=1)
    run = RLRun(cfg, init, None)
    run.rollout(0), run.score(0), run.update(0)
    saved = torch.load(run.ckpt.root / "rng" / "step-000001.pt", weights_only=True)
    run.close()
    torch.rand(1000), random.random()  # the process's RNG moves on
    resumed = RLRun(cfg, init, None)
    assert resumed.start_step == 1
    assert torch.equal(torch.get_rng_state(), saved["torch"])
    assert list(random.getstate()[1]) == list(saved["python"])
    resumed.close()


def test_a_changed_lr_takes_effect_on_resume_and_an_alert_factor_stays_a_multiplier(tmp_path):
    from hindsight.coordination.run import RLRun
    from hindsight.lookback.metrics import recorded

    init = tiny_init(tmp_path)
    lower = [{"rule": "kl_high", "threshold": -1.0, "window": 1, "action": "lower_lr", "factor": 0.5}]
    run = RLRun(rl_cfg(tmp_path, save_every=1, lr=1e-3, alerts=lower), init, None)
    run.rollout(0), run.score(0)
    metrics = recorded(run.update(0))  # the names the flow records and the alerts read
    run.observe(1, metrics)  # kl > -1 always: the rule fires once and halves the rate
    assert run.learner.optimizer.param_groups[0]["lr"] == 5e-4
    run.checkpoint(1)
    run.close()
    resumed = RLRun(rl_cfg(tmp_path, save_every=1, lr=4e-3, alerts=lower), init, None)
    assert resumed.start_step == 1
    assert resumed.learner.optimizer.param_groups[0]["lr"] == 2e-3  # the new rl.lr times the recorded 0.5
    resumed.rollout(1), resumed.score(1)
    m = resumed.update(1)
    assert m["lr"] == 2e-3 and m["lr/alert_multiplier"] == 0.5
    resumed.close()


def test_the_report_shows_the_configured_kl_estimator():
    from hindsight.lookback.report import token_kl, token_spans

    lp, ref = -1.0, -1.5
    assert abs(token_kl(lp, ref, "k1") - 0.5) < 1e-9 and abs(token_kl(lp, ref, "k2") - 0.125) < 1e-9
    html = token_spans([5], [lp], [ref], lambda ids: "x", "k1")
    assert 'data-kl="0.5000"' in html


_COUNTER = iter(range(10**9))


def always_signal(completions, **_):
    """A different reward for every completion: every group carries a signal."""
    return [float(next(_COUNTER)) for _ in completions]


def signal_on_even_answers(completions, answer, **_):
    """Signal only for prompts with an even answer: about half the groups are constant."""
    return [float(next(_COUNTER)) if int(a) % 2 == 0 else 1.0 for a in answer]


def test_replayed_groups_are_trained_under_dynamic_sampling(tmp_path):
    from hindsight.coordination.run import RLRun

    init = tiny_init(tmp_path)
    cfg = rl_cfg(tmp_path, rewards=[{"fn": "test_correctness:always_signal"}],
                  dynamic_sampling={"enabled": True, "oversample": 2.0}, replay={"ratio": 0.5, "window": 4})
    run = RLRun(cfg, init, None)
    run.rollout(0), run.score(0), run.update(0)
    r1 = run.rollout(1)[1]
    run.score(1)
    m1 = run.update(1)
    assert r1["replay/count"] == 2
    trained = {a["index"] for a in run.store.read("advantages", 1)}
    replayed = {r["index"] for r in run.store.read("rollouts", 1) if r["replayed"]}
    assert len(replayed) == 2 * 4 and replayed <= trained  # both replayed groups were trained
    assert m1["replay/trained"] == 2
    run.close()


def test_dynamic_sampling_samples_more_rounds_until_the_step_is_full(tmp_path):
    from hindsight.coordination.run import RLRun

    init = tiny_init(tmp_path)
    cfg = rl_cfg(tmp_path, prompts_per_step=6, rewards=[{"fn": "test_correctness:signal_on_even_answers"}],
                  dynamic_sampling={"enabled": True, "oversample": 1.0, "max_rounds": 5})
    run = RLRun(cfg, init, None)
    _, r0 = run.rollout(0)
    run.score(0)
    m0 = run.update(0)
    rows = run.store.read("rollouts", 0)
    assert r0["dynamic_sampling/rounds"] > 1
    assert len(rows) == r0["dynamic_sampling/rounds"] * 6 * 4  # every round's groups are stored
    assert m0["dynamic_sampling/kept_groups"] == 6  # a full step, not whatever one pass found
    assert sorted({r["index"] for r in rows}) == list(range(len(rows)))
    run.close()


def test_dynamic_sampling_stops_at_max_rounds(tmp_path):
    from hindsight.coordination.run import RLRun

    init = tiny_init(tmp_path)
    cfg = rl_cfg(tmp_path, rewards=[{"fn": "test_correctness:constant"}],
                  dynamic_sampling={"enabled": True, "oversample": 1.0, "max_rounds": 2})
    run = RLRun(cfg, init, None)
    _, r0 = run.rollout(0)
    run.score(0)
    assert r0["dynamic_sampling/rounds"] == 2 and run.update(0)["dynamic_sampling/kept_groups"] == 0
    run.close()


def constant(completions, **_):
    return [1.0] * len(completions)
