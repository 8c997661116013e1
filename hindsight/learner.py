"""One policy update over a batch of rollouts: advantages, then `num_iterations` passes of
the clipped policy-gradient loss against the behaviour log-probs stored in the rollout."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hindsight.algorithms.advantages import grpo_advantages, zero_variance_groups
from hindsight.algorithms.losses import LossSettings, policy_loss
from hindsight.experience import Experience
from hindsight.logprobs import token_logprobs


@dataclass(frozen=True)
class LearnerSettings:
    num_iterations: int = 1
    max_grad_norm: float = 1.0
    temperature: float = 1.0
    scale_rewards: str = "group"
    loss: LossSettings = LossSettings()


def compute_advantages(exp: Experience, s: LearnerSettings) -> torch.Tensor:
    return grpo_advantages(exp.rewards, exp.group_size, s.scale_rewards)   # (B,)


def update(model, optimizer, exp: Experience, s: LearnerSettings) -> dict[str, float]:
    """Train on one stored batch; returns metrics of the last pass (and the first pass's ratio)."""
    exp.advantages = compute_advantages(exp, s)
    mask = exp.completion_mask                                               # (B, T)
    model.train()
    metrics: dict[str, float] = {}
    ratios: dict[str, float] = {}
    for it in range(s.num_iterations):
        logp, entropy = token_logprobs(model, exp.input_ids, exp.attention_mask, mask.size(1),
                                       s.temperature, with_entropy=True)     # (B, T), (B, T)
        loss, stats = policy_loss(logp, exp.logprobs, exp.ref_logprobs, exp.advantages, mask, s.loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
        optimizer.step()
        m = mask.to(entropy.dtype)
        metrics = {"loss": float(loss), "grad_norm": float(grad_norm),
                   "entropy": float((entropy.detach() * m).sum() / m.sum().clamp(min=1)), **stats}
        ratios[f"ratio_mean/iter{it}"] = stats["ratio_mean"]
    metrics.update(ratios)
    metrics["zero_std_groups"] = float(zero_variance_groups(exp.rewards, exp.group_size).float().mean())
    return metrics
