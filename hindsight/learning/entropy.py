"""The adaptive entropy coefficient (Skywork-OR1; TRL's use_adaptive_entropy): after each
optimizer step the coefficient rises by `delta` while the mini-batch's mean token entropy is at or
below `target`, and falls otherwise, within [min, max]. The bonus applies only while the entropy
last measured is at or below the target. Its state goes with each checkpoint, so a resumed run
applies the coefficient the uninterrupted one would."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EntropyControl:
    coef: float
    target: float
    delta: float
    low: float
    high: float
    last: float = math.inf   # the entropy after the last optimizer step (none yet: the bonus is off)

    @classmethod
    def of(cls, cfg, coef: float) -> "EntropyControl | None":
        """From `rl.learner.adaptive_entropy` and the starting coefficient; None when it is off."""
        if not cfg.enabled:
            return None
        return cls(coef=coef, target=cfg.target, delta=cfg.delta, low=cfg.min, high=cfg.max)

    def applied(self) -> float:
        """The coefficient this optimizer step's micro-batches use (all the same)."""
        return self.coef if self.last <= self.target else 0.0

    def observe(self, entropy: float) -> None:
        """The mini-batch's mean token entropy after its step (over the learner group)."""
        step = self.delta if entropy <= self.target else -self.delta
        self.coef = min(max(self.coef + step, self.low), self.high)
        self.last = entropy

    def state(self) -> dict:
        return {"coef": self.coef, "last": self.last if math.isfinite(self.last) else None}

    def load(self, state: dict) -> None:
        self.coef = state["coef"]
        self.last = math.inf if state["last"] is None else state["last"]
