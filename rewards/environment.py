"""The environment's own reward as a reward function: what a multi-turn trajectory's environment
gave it (TRL's `get_reward()`, or a gym-style environment's summed step rewards), stored with
the rollout as the `env_reward` column. A trajectory whose environment gave none scores 0."""
from __future__ import annotations


def environment_reward(completions, env_reward=None, **_) -> list[float]:
    if env_reward is None:
        raise ValueError("no env_reward column: this reward reads what a multi-turn environment gave "
                         "(rl.rollout.multi_turn with an environment or a gym environment)")
    return [0.0 if r is None else float(r) for r in env_reward]
