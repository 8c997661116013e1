"""Per-step rollout metrics from the stored shards: what a practitioner watches besides the loss.

Names are stable (docs/metrics.md lists each one); dashboards, alerts and `hindsight compare`
read them by name.
"""
from __future__ import annotations

import json
import math
import resource
import sys

from hindsight.learning.algorithms.advantages import has_signal


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without numpy for a list of a few hundred."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def zero_variance_fraction(rewards: list[float], group_size: int) -> float:
    """Share of prompt groups whose completions all got the same reward (no GRPO signal)."""
    groups = [rewards[i:i + group_size] for i in range(0, len(rewards), group_size)]
    return sum(1.0 for g in groups if not has_signal(g)) / max(1, len(groups))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def _std(xs: list[float]) -> float:
    """Sample std (n-1), as torch.std: the in-batch reward spread the alerts compare."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def rollout_metrics(rows: list[dict], scores: list[dict], group_size: int, max_new_tokens: int) -> dict[str, float]:
    """Reward, length and completion statistics of one step's stored rollouts and scores."""
    rewards = [s["reward"] for s in scores]
    lengths = [len(r["completion_ids"]) for r in rows]
    truncated = [n >= max_new_tokens and not r["ended_with_eos"] for r, n in zip(rows, lengths)]
    out = {
        "reward/mean": _mean(rewards), "reward/std": _std(rewards),
        "reward/min": min(rewards), "reward/max": max(rewards),
        "reward/zero_std_fraction": zero_variance_fraction(rewards, group_size),
        "response_length/mean": _mean(lengths), "response_length/p95": percentile(lengths, 95),
        "response_length/truncated_fraction": sum(truncated) / len(rows),
        "rollout/completion_rate": sum(r["ended_with_eos"] for r in rows) / len(rows),
    }
    for key in [k for k in scores[0] if k.startswith("reward_")]:
        out[f"reward/{key.removeprefix('reward_')}"] = _mean([s[key] for s in scores])
    rm = [s["rm_score"] for s in scores if s.get("rm_score") is not None]
    if rm:
        out["reward/rm_score"] = _mean(rm)
    if "turns" in rows[0]:
        out.update(trajectory_metrics(rows))
    return out


def peak_memory() -> dict[str, float]:
    """Peak resident memory of this process (and of the GPU allocator where CUDA is used), in MiB."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"memory/cpu_peak_mb": rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        out["memory/gpu_peak_mb"] = torch.cuda.max_memory_allocated() / (1024 * 1024)
    return out


def trajectory_metrics(rows: list[dict]) -> dict[str, float]:
    """A step's multi-turn statistics, from its stored rows (so a resumed step logs what an
    uninterrupted one does): turns, tool calls, errors and time, the limits' cuts, and how many
    trajectories re-applying the template would have tokenised differently."""
    n = max(len(rows), 1)
    turns = [json.loads(r["turns"]) for r in rows]
    calls = [c for ts in turns for turn in ts for c in turn.get("calls", [])]
    return {"multiturn/turns": sum(sum(x["role"] == "assistant" for x in ts) for ts in turns) / n,
            "multiturn/tool_calls": len(calls) / n,
            "multiturn/tool_error_rate": sum(c["error"] for c in calls) / max(len(calls), 1),
            "multiturn/tool_seconds": sum(c["seconds"] for c in calls),
            "multiturn/cut_by_turns": sum(r["cut"] == "turns" for r in rows) / n,
            "multiturn/cut_by_tokens": sum(r["cut"] == "tokens" for r in rows) / n,
            "multiturn/retokenize_mismatches": float(sum(r["retokenize_mismatch"] for r in rows))}


# What a practitioner reads first, in this order; everything else (bookkeeping: learn/, time/,
# memory/, lr/, ...) follows alphabetically. `hindsight compare` lists metrics in this order.
WATCH_FIRST = ("reward/mean", "eval/accuracy", "reward/", "eval/", "policy/kl", "policy/entropy", "response_length/",
               "policy/clip_fraction", "policy/", "rollout/", "offpolicy/", "multiturn/", "critic/")

# MLflow lays a run's charts out in sections, one per name prefix, sorted by code point, with
# unprefixed names last. So what a practitioner watches is recorded under sections of its own
# (policy/, reward/, eval/, response_length/, rollout/ ...) and the bookkeeping under runtime/,
# which sorts after every one of them. Producers keep short local names (the update returns
# `kl`, `loss`); `recorded` names a step's metrics once, where the step is recorded, so the run's
# history, its alerts, MLflow and the report all read the same names (docs/metrics.md).
WATCHED = ("reward", "eval", "response_length", "rollout", "offpolicy", "multiturn", "critic", "negative_ft", "policy")
RUNTIME = ("learn", "time", "memory", "store", "lr", "dynamic_sampling", "replay", "config", "publish", "engine", "async",
           "workers")
RUNTIME_NAMES = ("rollout/tokens_per_s", "rollout/reused")


def recorded_name(name: str) -> str:
    """The name a step's metric is recorded under: bookkeeping under runtime/, the update's own
    statistics (kl, entropy, loss, grad_norm, clip_fraction, ratio_mean ...) under policy/."""
    head = name.partition("/")[0]
    if head == "runtime":  # already recorded
        return name
    if head in RUNTIME or name in RUNTIME_NAMES:
        return f"runtime/{name}"
    if head in WATCHED:
        return name
    return f"policy/{name}"


def recorded(metrics: dict) -> dict:
    """A step's metrics under their recorded names (`recorded_name`)."""
    return {recorded_name(k): v for k, v in metrics.items()}


def watch_order(name: str) -> tuple[int, str]:
    """A sort key: a metric's place in WATCH_FIRST (a name, or a prefix ending in /), then its
    name; other stages' metrics after those, and the bookkeeping (runtime/) last, as in MLflow."""
    for i, key in enumerate(WATCH_FIRST):
        if name == key or (key.endswith("/") and name.startswith(key)):
            return i, name
    return len(WATCH_FIRST) + name.startswith("runtime/"), name
