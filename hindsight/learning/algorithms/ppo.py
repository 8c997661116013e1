"""PPO: a critic's values and GAE over KL-shaped token rewards, whitened over the batch."""
from __future__ import annotations

from pydantic import Field

from hindsight.learning.algorithms.base import AdvantageInputs, Algorithm, CriticSettings, register


class PPOSettings(CriticSettings):
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")


@register
class PPO(Algorithm):
    name = "ppo"
    token_advantages = True
    Settings = PPOSettings
    needs_critic = True

    @staticmethod
    def advantages(x: AdvantageInputs, s: PPOSettings):
        from hindsight.learning.algorithms.advantages import gae, masked_whiten, token_rewards  # torch: lazily (base)

        token_r = token_rewards(x.rewards, x.mask, x.kl, x.kl_coef)               # (B, T)
        advantages, returns = gae(token_r, x.values, x.mask, s.gamma, s.lam)     # (B, T) each
        return masked_whiten(advantages, x.mask), returns
