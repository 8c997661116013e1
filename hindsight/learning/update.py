"""One policy update over a batch of rollouts.

Every algorithm is an advantage estimator (`hindsight.learning.algorithms`) plugged into the same
clipped policy-gradient kernel: advantages first, then `num_iterations` passes of the loss
against the behaviour log-probs stored in the rollout. An algorithm with a critic (PPO)
also trains it on the same batch.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from hindsight.learning.algorithms import get_algorithm
from hindsight.learning.algorithms.base import AdvantageInputs, AlgorithmSettings
from hindsight.learning.algorithms.losses import LossSettings, kl_estimate, policy_loss, tis_weights, value_loss
from hindsight.learning.critic import token_values
from hindsight.experience import Experience
from hindsight.logprobs import group_token_logprobs, model_device


@dataclass(frozen=True, kw_only=True)
class LearnerSettings:
    algorithm: str = "grpo"
    params: AlgorithmSettings | None = None   # the algorithm's own block (rl.<name>); None: its defaults
    num_iterations: int = 1
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    loss: LossSettings = LossSettings()
    reward_kl_coef: float = 0.0               # > 0 when `kl.in: reward`
    is_correction: str = "none"               # tis: weight by the learner/engine probability ratio
    is_cap: float = 2.0

    @property
    def estimator(self):
        return get_algorithm(self.algorithm)

    @property
    def algorithm_settings(self) -> AlgorithmSettings:
        return self.params if self.params is not None else self.estimator.Settings()


def learner_settings(rl) -> LearnerSettings:
    """The learner's view of a validated `RLConfig`; the one place settings are built.

    Fields named like the config's are taken from it by name; only the derived ones are spelt
    out, so a new config field cannot be copied into the wrong slot.
    """
    in_loss = rl.kl.placement == "loss"
    loss = _by_name(LossSettings, rl, kl_coef=rl.kl.coef if in_loss else 0.0, kl_estimator=rl.kl.estimator,
                    max_len=rl.rollout.max_new_tokens)
    return _by_name(LearnerSettings, rl, params=rl.algorithm_settings(), temperature=rl.rollout.temperature,
                    loss=loss, reward_kl_coef=0.0 if in_loss else rl.kl.coef,
                    is_correction=rl.async_.is_correction, is_cap=rl.async_.is_cap)


def _by_name(cls, source, **derived):
    return cls(**{f.name: getattr(source, f.name) for f in fields(cls) if f.name not in derived}, **derived)


def reward_kl(exp: Experience, s: LearnerSettings) -> torch.Tensor | None:
    """(B, T) KL of the behaviour policy from the reference, for the reward penalty."""
    if not s.reward_kl_coef or exp.ref_logprobs is None:
        return None
    return kl_estimate(exp.logprobs, exp.ref_logprobs, s.loss.kl_estimator, exp.completion_mask)


def compute_advantages(exp: Experience, s: LearnerSettings, values: torch.Tensor | None = None):
    """Returns (advantages (B,) or (B, T), returns (B, T) for a critic's targets else None)."""
    x = AdvantageInputs(rewards=exp.rewards, mask=exp.completion_mask, group_size=exp.group_size,
                        kl=reward_kl(exp, s), kl_coef=s.reward_kl_coef, values=values)
    return s.estimator.advantages(x, s.algorithm_settings)


@dataclass(frozen=True, kw_only=True)
class Share:
    """How one learner's share of a batch joins the whole in the learner group: each loss is
    scaled to its part of the whole batch's loss, and after each backward the gradients are
    summed over the group and divided by its size (what DDP does, made explicit, so the critic,
    whose values are read past the model's forward, is synchronised the same way)."""
    policy_scale: float = 1.0
    critic_scale: float = 1.0
    world: int = 1

    def sync(self, params) -> None:
        if self.world == 1:
            return
        import torch.distributed as dist

        params = [p for p in params if p.requires_grad]
        for p in params:
            if p.grad is None:  # a parameter this share did not reach still takes part in the sum
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])                  # (N,)
        dist.all_reduce(flat)
        flat /= self.world
        at = 0
        for p in params:
            p.grad.copy_(flat[at:at + p.numel()].view_as(p))
            at += p.numel()


def whole_batch_advantages(exp: Experience, s: LearnerSettings, critic=None) -> Experience:
    """Set the batch's advantages (and a critic's values and returns) on `exp`, unless they are
    set: the one place they are computed, always on the whole batch, before any rank takes its
    share, so the learner group and a launched update see the numbers one process would."""
    if exp.advantages is not None:
        return exp
    if s.estimator.needs_critic and exp.values is None:
        on = exp.to(model_device(critic))
        with torch.no_grad():
            exp.values = token_values(critic, on.input_ids, on.attention_mask, exp.completion_mask.size(1)).cpu()  # (B, T)
    exp.advantages, exp.returns = compute_advantages(exp, s, exp.values)
    return exp


def update(model, optimizer, exp: Experience, s: LearnerSettings, critic=None, critic_optimizer=None,
           loss_scale: float = 1.0, share: Share | None = None) -> dict:
    """Train on one stored batch; returns metrics of the last pass (and every pass's ratio).

    The batch's advantages are computed first if they are not set (`whole_batch_advantages`);
    a share of a batch (`exp.rows`) carries the whole batch's. `loss_scale` turns a share's loss
    into its part of the whole batch's loss under DDP (`learning.launch.rl_update`), and `share`
    does the same in the learner group (`hindsight.learning.group`).
    """
    share = share or Share(policy_scale=loss_scale)
    exp = whole_batch_advantages(exp, s, critic).to(model_device(model))
    model.train()
    metrics: dict[str, float] = {}
    for it in range(s.num_iterations):
        step = _policy_step(model, optimizer, exp, s, share)
        if critic is not None:
            step.update(_critic_step(critic, critic_optimizer, exp, exp.values, exp.returns, s, share))
        metrics.update(step)
        metrics[f"ratio_mean/iter{it}"] = step["ratio_mean"]
    return metrics


def _policy_step(model, optimizer, exp: Experience, s: LearnerSettings, share: Share) -> dict:
    mask = exp.completion_mask
    logp, entropy = group_token_logprobs(model, exp.input_ids, exp.attention_mask, mask.size(1), exp.group_size,
                                         s.temperature, with_entropy=True)       # (B, T), (B, T)
    is_w = None
    if s.is_correction == "tis" and exp.engine_logprobs is not None:
        is_w = tis_weights(exp.logprobs, exp.engine_logprobs, s.is_cap)         # (B, T)
    loss, stats = policy_loss(logp, exp.logprobs, exp.ref_logprobs, exp.advantages, mask, s.loss, entropy, is_w)
    optimizer.zero_grad(set_to_none=True)
    (loss * share.policy_scale).backward()
    share.sync(model.parameters())
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
    optimizer.step()
    m = mask.to(entropy.dtype)
    n = m.sum().clamp(min=1)
    if is_w is not None:
        stats.update({"is/mean": float((is_w * m).sum() / n), "is/max": float((is_w * m).max()),
                      "is/capped_fraction": float(((is_w >= s.is_cap).to(m.dtype) * m).sum() / n)})
    return {"loss": float(loss.detach()), "grad_norm": float(grad_norm),
            "entropy": float((entropy.detach() * m).sum() / n), **stats}


def _critic_step(critic, optimizer, exp: Experience, old_values, returns, s: LearnerSettings, share: Share) -> dict:
    critic.train()
    values = token_values(critic, exp.input_ids, exp.attention_mask, exp.completion_mask.size(1))  # (B, T)
    loss, clipped = value_loss(values, old_values, returns, exp.completion_mask, s.algorithm_settings.value_clip)
    optimizer.zero_grad(set_to_none=True)
    (loss * share.critic_scale).backward()
    share.sync(critic.parameters())
    grad_norm = torch.nn.utils.clip_grad_norm_(critic.parameters(), s.max_grad_norm)
    optimizer.step()
    return {"critic/loss": float(loss.detach()), "critic/grad_norm": float(grad_norm),
            "critic/value_clip_fraction": clipped}
