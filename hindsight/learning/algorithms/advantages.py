"""Advantage estimators. Completions of one prompt are contiguous: a batch is G groups of S."""
from __future__ import annotations

import torch

STD_EPS = 1e-4  # TRL's constant, so our advantages equal GRPOTrainer's on the same rewards


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group") -> torch.Tensor:
    """Group-normalised advantages (GRPO).

    rewards: (B,) with B = G * S. Returns (B,).
    scale: 'group' divides by each group's std, 'batch' by the batch std (Dr. GRPO-style
    robustness when groups are nearly constant), 'none' keeps raw centred rewards.
    """
    grouped = rewards.view(-1, group_size)                        # (G, S)
    centred = grouped - grouped.mean(dim=1, keepdim=True)         # (G, S)
    if scale == "group":
        centred = centred / (grouped.std(dim=1, keepdim=True) + STD_EPS)
    elif scale == "batch":
        centred = centred / (rewards.std() + STD_EPS)
    elif scale != "none":
        raise ValueError(f"unknown scale_rewards: {scale}")
    return centred.reshape(-1)                                    # (B,)


def gdpo_advantages(parts: torch.Tensor, weights: torch.Tensor, group_size: int) -> torch.Tensor:
    """GDPO (TRL's normalize_then_sum): each reward normalised within its group, summed with its
    weight, and the sum normalised over the batch. parts: (B, K) raw scores; weights: (K,). Returns (B,)."""
    grouped = parts.view(-1, group_size, parts.size(1))                            # (G, S, K)
    normed = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + STD_EPS)
    summed = (normed.reshape(-1, parts.size(1)) * weights.to(parts.dtype)).sum(dim=1)  # (B,)
    return (summed - summed.mean()) / (summed.std() + STD_EPS)


SIGNAL_EPS = 1e-8  # rewards closer than this within a group count as equal


def has_signal(group) -> bool:
    """A group of completions of one prompt carries a learning signal when its rewards differ:
    the one definition that dynamic sampling, replay and the metrics use."""
    return max(group) - min(group) >= SIGNAL_EPS


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out: each completion's baseline is the mean of the others in its group.

    rewards: (B,). Returns (B,). Equals S/(S-1) * (r - group mean).
    """
    grouped = rewards.view(-1, group_size)                                    # (G, S)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)  # (G, S)
    return (grouped - baseline).reshape(-1)                                   # (B,)


def token_rewards(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                  kl_coef: float = 0.0) -> torch.Tensor:
    """Spread an outcome reward over tokens: `-kl_coef * kl` on every token, plus the reward
    on the last real token (InstructGPT's shaping, used by REINFORCE++ and PPO).

    rewards: (B,); mask: (B, T); kl: (B, T) or None. Returns (B, T).
    """
    m = mask.to(torch.float32)                                                # (B, T)
    out = torch.zeros_like(m)                                                 # (B, T)
    last = (m.sum(dim=1).long() - 1).clamp(min=0)                             # (B,)
    out[torch.arange(m.size(0)), last] = rewards.to(torch.float32)
    if kl is not None and kl_coef:
        out = out - kl_coef * kl * m
    return out * m


def discounted_returns(token_r: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = sum_{k >= t} gamma^(k-t) r_k, right to left. token_r: (B, T). Returns (B, T)."""
    returns = torch.zeros_like(token_r)                                       # (B, T)
    running = torch.zeros_like(token_r[:, 0])                                 # (B,)
    for t in reversed(range(token_r.size(1))):
        running = token_r[:, t] + gamma * running
        returns[:, t] = running
    return returns


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Normalise over all real tokens of the batch (population std). x, mask: (B, T) -> (B, T)."""
    m = mask.to(x.dtype)
    n = m.sum().clamp(min=1.0)
    mean = (x * m).sum() / n
    var = ((x - mean).pow(2) * m).sum() / n
    return (x - mean) * torch.rsqrt(var + eps) * m


def reinforce_pp_advantages(rewards: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None,
                            kl_coef: float, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++: the KL-shaped return of each token, whitened over the whole batch; no critic.

    rewards: (B,); mask, kl: (B, T). Returns (B, T).
    """
    returns = discounted_returns(token_rewards(rewards, mask, kl, kl_coef), gamma)  # (B, T)
    return masked_whiten(returns, mask)


def gae(token_r: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over completion tokens.

    token_r, values, mask: (B, T). The value after the last real token is 0 (the episode
    ends). Positions outside the mask inside a row (a multi-turn trajectory's tool turns) are
    stepped over: a model token's next value is that of the next model token, so the return
    flows across a tool's reply instead of ending the episode at it. Returns (advantages (B, T),
    returns (B, T)), zero outside the mask.
    """
    m = mask.to(values.dtype)                                                 # (B, T)
    v = values * m                                                            # (B, T)
    adv = torch.zeros_like(v)                                                 # (B, T)
    running = torch.zeros_like(v[:, 0])                                       # (B,)
    next_v = torch.zeros_like(running)                                        # (B,) value of the next masked-in token
    for t in reversed(range(v.size(1))):
        on = m[:, t] > 0                                                      # (B,)
        delta = token_r[:, t] + gamma * next_v - v[:, t]
        running = torch.where(on, delta + gamma * lam * running, running)
        next_v = torch.where(on, v[:, t], next_v)
        adv[:, t] = running * m[:, t]
    return adv, (adv + v) * m


def sequence_kl_penalty(rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Outcome estimators (GRPO, RLOO) with `kl.in: reward`: r - coef * sum_t kl_t.

    rewards: (B,); kl, mask: (B, T). Returns (B,).
    """
    return rewards - kl_coef * (kl * mask.to(kl.dtype)).sum(dim=1)
