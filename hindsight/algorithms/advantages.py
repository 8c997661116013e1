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


def zero_variance_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(G,) bool: groups whose completions all got the same reward carry no GRPO signal."""
    grouped = rewards.view(-1, group_size)                        # (G, S)
    return (grouped.max(dim=1).values - grouped.min(dim=1).values).abs() < 1e-8
