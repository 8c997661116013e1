"""An RL algorithm is one object: its advantage estimator, its settings block, and what it needs.

Every algorithm plugs into the same clipped policy-gradient kernel (`hindsight.learning.update`);
only the advantages differ. A class registered here is known to the config (`rl.algorithm`
takes its name, `rl.<name>:` holds its settings) and to the learner, with no other edit.
docs/design.md walks through adding one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hindsight.registry import Registry

if TYPE_CHECKING:  # the config imports every algorithm for its block, and must not pay for torch
    import torch


class AlgorithmSettings(BaseModel):
    """An algorithm's own block under `rl.<name>`; unknown keys fail like everywhere else."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class CriticSettings(AlgorithmSettings):
    """What the learner needs to train a value model beside the policy (`needs_critic`)."""
    value_clip: float = Field(0.2, gt=0)
    critic_lr: float = Field(1e-4, gt=0)
    critic_init: Literal["reward_model", "policy"] = Field(
        "policy", description="reward_model: start from NAME-rm; policy: the policy's weights with a fresh value head")


@dataclass(frozen=True, kw_only=True)
class AdvantageInputs:
    """What an estimator may read. Completions of one prompt are contiguous: B = G groups * S."""
    rewards: torch.Tensor             # (B,) outcome reward per completion
    mask: torch.Tensor                # (B, T) 1 on real completion tokens
    group_size: int                   # S
    kl: torch.Tensor | None = None    # (B, T) behaviour-vs-reference KL when `kl.in: reward`, else None
    kl_coef: float = 0.0              # its weight in the reward
    values: torch.Tensor | None = None  # (B, T) the critic's values, for algorithms with `needs_critic`
    reward_parts: torch.Tensor | None = None    # (B, K) each reward's raw score (GDPO normalises them apart)
    reward_weights: torch.Tensor | None = None  # (K,) their weights


class Algorithm:
    """Subclass, set the class attributes, implement `advantages`, and decorate with `@register`."""
    name: ClassVar[str]
    Settings: ClassVar[type[AlgorithmSettings]] = AlgorithmSettings
    needs_critic: ClassVar[bool] = False
    token_advantages: ClassVar[bool] = False  # (B, T) advantages: a sequence-level loss refuses them
    min_group_size: ClassVar[int] = 1
    group_size_reason: ClassVar[str] = ""

    @staticmethod
    def advantages(x: AdvantageInputs, settings: AlgorithmSettings) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(advantages (B,) or (B, T), returns (B, T) for the critic's targets or None)."""
        raise NotImplementedError


def _has_critic_settings(cls: type[Algorithm]) -> None:
    if cls.needs_critic and not issubclass(cls.Settings, CriticSettings):
        raise TypeError(f"{cls.__name__}: an algorithm with needs_critic has Settings derived from CriticSettings")


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", validate=_has_critic_settings)
register, unregister, get_algorithm = ALGORITHMS.register, ALGORITHMS.remove, ALGORITHMS.lookup
