"""Where a run will plateau: ScaleRL's saturating curve fitted to its points while it trains.

ScaleRL (Khatri et al., 2025, "The Art of Scaling RL Compute") fits the reward or accuracy R
against the compute C spent so far with

    R(C) = R0 + (A - R0) / (1 + (C_mid / C) ** B)

A is the asymptote (where the run plateaus), C_mid the compute at which half of the gain is
made, B how sharply it is made, R0 the starting value. Here C
is the samples trained on (steps x samples a step), which is proportional to the FLOPs of a run
whose batch and lengths do not change.

The fit is exact on a grid: R is linear in (R0, A) for each (C_mid, B), so they have a closed
form and the residual sum of squares (RSS) comes with it, for 96 x 24 pairs at once. The
confidence interval is the profile one: every (C_mid, B, A) whose RSS stays within an F-test's
threshold of the best, which holds where the data cannot tell parameters apart (a flat curve,
a curve far from its midpoint) and at A's bounds.

C_mid is limited to `horizon` (the run's planned samples, or 4x the last point's): the fit
says where the run plateaus given that half its gain comes within the budget it plans. Without
a limit a flat curve fits any asymptote (it could rise later), so nothing could be said.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

Z95 = 1.96


@dataclass
class CurveFit:
    asymptote: float
    asymptote_lo: float
    asymptote_hi: float
    midpoint: float        # C_mid, in the x unit (samples)
    midpoint_lo: float
    midpoint_hi: float
    exponent: float
    start: float           # R0
    points: int
    rmse: float

    def predict(self, x) -> np.ndarray:
        return sigmoid(np.asarray(x, float), self.start, self.asymptote, self.midpoint, self.exponent)

    def metrics(self, prefix: str) -> dict[str, float]:
        return {f"{prefix}/{k}": float(v) for k, v in asdict(self).items() if k not in ("start", "exponent", "points")}


def sigmoid(x: np.ndarray, r0: float, a: float, mid: float, b: float) -> np.ndarray:
    """R(x) for x >= 0 (x = 0 is the start: R0)."""                   # (n,)
    return r0 + (a - r0) * _shape(np.maximum(np.asarray(x, float), 0.0), np.asarray(mid), np.asarray(b))


def fit_curve(x, y, bounds: tuple[float, float] | None = None, horizon: float | None = None,
              level: float = 0.95) -> CurveFit | None:
    """The saturating curve through points (x, y), x in samples; None with fewer than 4 points.
    `bounds` limit the asymptote (accuracy: (0, 1)); without them it may lie up to twice the
    observed range beyond the data. `horizon` caps C_mid (see the module's note)."""
    from scipy.stats import f as f_dist

    x, y = np.asarray(x, float), np.asarray(y, float)                  # (n,), (n,)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    pos = x[x > 0]
    if len(x) < 4 or len(pos) < 2:
        return None
    span = max(float(np.ptp(y)), 1e-6)
    lo, hi = bounds if bounds is not None else (float(y.min()) - 2 * span, float(y.max()) + 2 * span)
    mids = np.exp(np.linspace(math.log(pos.min() / 4), math.log(horizon or 4 * pos.max()), 96))   # (M,)
    exps = np.exp(np.linspace(math.log(0.5), math.log(3.0), 24))                                # (E,)
    mid, b = np.meshgrid(mids, exps, indexing="ij")                    # (M, E) each
    g = _shape(x, mid.reshape(-1, 1), b.reshape(-1, 1))                # (K, n): the rise, 0 at x=0 .. 1
    r0, a, rss, inv_aa = _linear_fit(g, y, lo, hi)                     # (K,) each
    k = int(np.argmin(rss))
    n = len(x)
    limit = rss[k] * (1 + f_dist.ppf(level, 1, max(n - 4, 1)) / max(n - 4, 1))
    ok = rss <= limit                                                  # (K,): pairs within the threshold
    room = np.sqrt(np.maximum(limit - rss[ok], 0.0) * inv_aa[ok])      # how far A moves before RSS crosses it
    return CurveFit(asymptote=float(a[k]), asymptote_lo=float(max(lo, (a[ok] - room).min())),
                    asymptote_hi=float(min(hi, (a[ok] + room).max())), midpoint=float(mid.flat[k]),
                    midpoint_lo=float(mid.reshape(-1)[ok].min()), midpoint_hi=float(mid.reshape(-1)[ok].max()),
                    exponent=float(b.flat[k]), start=float(r0[k]), points=n, rmse=math.sqrt(rss[k] / n))


def _linear_fit(g: np.ndarray, y: np.ndarray, lo: float, hi: float):
    """For each shape g (K, n): R = R0 (1 - g) + A g is linear in (R0, A); their least squares
    with A >= R0, A clipped to [lo, hi] (R0 refitted then), the RSS, and (X^T X)^-1's A entry (how fast the RSS
    grows as A leaves its best value)."""
    u, v = 1.0 - g, g                                                  # (K, n) each
    suu, suv, svv = (u * u).sum(1) + 1e-9, (u * v).sum(1), (v * v).sum(1) + 1e-9   # (K,)
    suy, svy = (u * y).sum(1), (v * y).sum(1)                          # (K,)
    det = np.maximum(suu * svv - suv * suv, 1e-12)
    a = np.clip((suu * svy - suv * suy) / det, lo, hi)                 # (K,)
    r0 = (suy - a * suv) / suu                                         # (K,)
    # a reward or accuracy curve rises: where the best line falls, the flat one (A = R0 = mean)
    # is the fit, or noise in a flat run would read as a collapse to a low asymptote
    falls = a < r0
    a, r0 = np.where(falls, np.clip(y.mean(), lo, hi), a), np.where(falls, np.clip(y.mean(), lo, hi), r0)
    rss = ((r0[:, None] * u + a[:, None] * v - y) ** 2).sum(1)         # (K,)
    return r0, a, rss, suu / det


def _shape(x: np.ndarray, mid: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(R - R0) / (A - R0) at x: 0 at the start, 1/2 at the midpoint, 1 far beyond it."""   # (K, n)
    with np.errstate(divide="ignore", over="ignore"):
        ratio = (mid / np.where(x > 0, x, 1.0)) ** b
    return np.where(x > 0, 1.0 / (1.0 + ratio), 0.0)


def run_curves(history: list[dict], samples_per_step: int, min_points: int, steps: int) -> dict[str, float]:
    """`reward/curve/*` from every step's reward/mean and `eval/curve/*` from the evaluations,
    once each has `min_points` points; the metrics a step logs."""
    out: dict[str, float] = {}
    for key, prefix, bounds in (("reward/mean", "reward/curve", None), ("eval/accuracy", "eval/curve", (0.0, 1.0))):
        pts = [(h["step"] * samples_per_step, h[key]) for h in history if isinstance(h.get(key), (int, float))]
        if len(pts) >= min_points:
            fit = fit_curve(*zip(*pts), bounds=bounds, horizon=steps * samples_per_step)
            if fit is not None:
                out.update(fit.metrics(prefix))
    return out
