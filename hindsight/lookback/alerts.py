"""Alert rules over the RL metric history: notice a run going wrong before it wastes the budget.

Each rule is a pure function of the history (one dict per step, oldest first) that returns
the observed value when the rule's condition holds, else None. `AlertMonitor` fires a rule
when its condition becomes true (edge-triggered), so a lasting condition is reported once and
`lower_lr` does not shrink the learning rate on every step; it fires again once it has cleared.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from hindsight.lookback.history import as_float
from hindsight.registry import Registry


@dataclass(frozen=True)
class Alert:
    step: int
    rule: str
    value: float
    threshold: float
    action: str
    message: str
    factor: float = 1.0  # what lower_lr multiplies the learning rate by

    def to_dict(self) -> dict:
        return asdict(self)


# rule name -> its function: the config's `rl.alerts[].rule` names are these
RULES: Registry = Registry("alert rule")


def rule(message: str):
    """Register an alert rule under its function's name, with the line it prints when it fires
    (`message`: {v} the observed value, {t} the threshold)."""
    def add(fn):
        fn.message = message
        return RULES.named(fn.__name__)(fn)
    return add


def window_mean(history: list[dict], key: str, window: int) -> float | None:
    """Mean of `key` over the last `window` steps that logged it; None until there are that many.
    Read from the newest step back, so a step's rules cost the window, not the run's length."""
    values = []
    for h in reversed(history):
        if key in h:
            values.append(as_float(h[key]))
            if len(values) == window:
                break
    if len(values) < window:
        return None
    return sum(values) / window


@rule('entropy {v:.4g} < {t:g} (collapse)')
def entropy_low(history, threshold, window):
    v = window_mean(history, "policy/entropy", window)
    return v if v is not None and v < threshold else None


@rule('reward std {v:.4g} < {t:g} (no signal)')
def reward_std_low(history, threshold, window):
    v = window_mean(history, "reward/std", window)
    return v if v is not None and v < threshold else None


@rule('KL {v:.4g} > {t:g}')
def kl_high(history, threshold, window):
    v = window_mean(history, "policy/kl", window)
    return v if v is not None and v > threshold else None


@rule('loss or grad norm is {v}')
def nonfinite_loss(history, threshold, window):
    """A NaN or Inf loss or grad norm at the newest step: the update has already gone bad."""
    last = history[-1] if history else {}
    for key in ("policy/loss", "policy/grad_norm"):
        if key in last and not math.isfinite(as_float(last[key])):
            return as_float(last[key])
    return None


def _length_ratio(history, window) -> float | None:
    """Mean response length over the window, relative to the run's first step."""
    first = next((as_float(h["response_length/mean"]) for h in history if "response_length/mean" in h), None)
    now = window_mean(history, "response_length/mean", window)
    if first is None or now is None or first <= 0:
        return None
    return now / first


@rule("response length at {v:.2f}x the first step's (< {t:g}x)")
def length_collapse(history, threshold, window):
    v = _length_ratio(history, window)
    return v if v is not None and v < threshold else None


@rule("response length at {v:.2f}x the first step's (> {t:g}x)")
def length_explode(history, threshold, window):
    v = _length_ratio(history, window)
    return v if v is not None and v > threshold else None


@rule('reward rose while eval/accuracy fell by {v:.3f} (> {t:g})')
def reward_hacking(history, threshold, window):
    """Training reward went up while held-out accuracy went down by more than `threshold`.

    Compares the newest eval point with the one `window` eval points earlier. The reward at
    an eval point is the mean of `reward/mean` over the last steps before it (the first step's
    reward for the initial eval, which ran before any rollout).
    """
    if not history or "eval/accuracy" not in history[-1]:  # only an eval step can fire: no scan on the others
        return None
    evals = [(h["step"], as_float(h["eval/accuracy"])) for h in history if "eval/accuracy" in h]
    if len(evals) <= window:
        return None
    (s0, acc0), (s1, acc1) = evals[-1 - window], evals[-1]
    r0, r1 = _reward_at(history, s0), _reward_at(history, s1)
    if r0 is None or r1 is None:
        return None
    drop = acc0 - acc1
    return drop if r1 > r0 and drop > threshold else None


def _reward_at(history, step: int, span: int = 3) -> float | None:
    before = [as_float(h["reward/mean"]) for h in history if "reward/mean" in h and h["step"] <= step][-span:]
    if not before:
        before = [as_float(h["reward/mean"]) for h in history if "reward/mean" in h][:1]
    return sum(before) / len(before) if before else None


class AlertMonitor:
    def __init__(self, rules: list, history: list[dict] | None = None):
        self.rules = list(rules)
        self.history: list[dict] = list(history or [])
        self._active: set[int] = set()

    def observe(self, step: int, metrics: dict) -> list[Alert]:
        """Add one step's metrics (merged into the step if it was seen); return the alerts that fire now."""
        if self.history and self.history[-1]["step"] == step:
            self.history[-1].update(metrics)
        else:
            self.history.append({"step": step, **metrics})
        fired = []
        for i, r in enumerate(self.rules):
            value = RULES[r.rule](self.history, r.threshold, r.window)
            if value is None:
                self._active.discard(i)
                continue
            if i not in self._active:
                msg = f"step {step}: {r.rule}: " + RULES[r.rule].message.format(v=value, t=r.threshold) + f" -> {r.action}"
                fired.append(Alert(step, r.rule, float(value), r.threshold, r.action, msg, r.factor))
            self._active.add(i)
        return fired
