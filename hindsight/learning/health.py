"""A diverging update is caught, not only a non-finite one (`rl.learner.health`).

Each optimizer step's loss and gradient norm must stay within a band of their running medians
(after a few steps of warm-up), checked before the step is taken; the weights' norm must not
change by more than a share of itself in one step, checked after it. A step outside its band
stops the run before its checkpoint, so every checkpoint a resume can start from was written
after healthy steps. The values the checks read are the learner group's totals (the loss and
gradient norm every rank agrees on, the weight norm gathered over the shards), so every rank
stops at the same step. The bound on any single weight (`model.max_weight_abs`) is checked on
what is checkpointed and registered (`state.checkpoint.require_healthy`).
"""
from __future__ import annotations

import math
import statistics

import torch

from hindsight.errors import NonFiniteError


class DivergedError(NonFiniteError):
    """A step whose loss, gradient norm or weight norm left its band: the run stops before its checkpoint."""


def weight_norm(params) -> float:
    """The global L2 norm of the weights, summed in float64 (weights at 1e30 have a norm float32
    cannot hold); a sharded model's comes back whole on every rank."""
    total = 0.0
    for p in params:
        squares = p.detach().to(torch.float64).pow(2).sum()
        total += float(squares.full_tensor() if hasattr(squares, "full_tensor") else squares)
    return math.sqrt(total)


def outside(value: float, history: list[float], factor: float, floor: float) -> bool:
    """Whether `value` is beyond `factor` times the median of `history` (plus `floor`)."""
    return abs(value) > factor * statistics.median(abs(v) for v in history) + floor


class Health:
    def __init__(self, cfg):
        self.cfg = cfg
        self.losses: list[float] = []
        self.grads: list[float] = []
        self.norm: float | None = None

    def before_step(self, loss: float, grad_norm: float, params=None) -> None:
        """Raise before the optimizer step when the loss or gradient norm left its band; the
        first step also measures the weights it starts from (`params`)."""
        c = self.cfg
        if c.enabled and self.norm is None and params is not None:
            self.norm = weight_norm(params)
        if c.enabled and len(self.grads) >= c.warmup_steps:
            if outside(grad_norm, self.grads, c.grad_norm_factor, c.grad_norm_floor):
                raise DivergedError(f"the gradient norm {grad_norm:.4g} is above {c.grad_norm_factor:g} times its "
                                    f"running median {statistics.median(self.grads):.4g} + {c.grad_norm_floor:g} "
                                    f"(rl.learner.health.grad_norm_factor): the optimizer step was skipped")
            if outside(loss, self.losses, c.loss_factor, c.loss_floor):
                raise DivergedError(f"the loss {loss:.4g} is above {c.loss_factor:g} times its running median "
                                    f"|{statistics.median(abs(v) for v in self.losses):.4g}| + {c.loss_floor:g} "
                                    f"(rl.learner.health.loss_factor): the optimizer step was skipped")
        self.losses = (self.losses + [loss])[-c.window:]
        if grad_norm > 0:  # a step whose groups all tie has no gradient: it says nothing of the norm's scale
            self.grads = (self.grads + [grad_norm])[-c.window:]

    def after_step(self, params) -> None:
        """Raise after the optimizer step when the weights' norm jumped."""
        if not self.cfg.enabled:
            return
        norm = weight_norm(params)
        before, self.norm = self.norm, norm
        if not math.isfinite(norm):
            raise DivergedError(f"the weights' norm is {norm:g} after the optimizer step")
        if before is not None and abs(norm - before) > self.cfg.weight_change * before:
            raise DivergedError(f"the weights' norm went from {before:.6g} to {norm:.6g} in one optimizer step, a "
                                f"change of more than {self.cfg.weight_change:g} of itself (rl.learner.health."
                                f"weight_change)")
