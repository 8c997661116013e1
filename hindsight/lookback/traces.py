"""What one sampled trajectory looks like as a trace: plain records built from the rollout store.

A record is JSON (it is what the tracking spool keeps during an MLflow outage) and names
everything the trace will hold:

    id        a trace id derived from (run, kind, step, index): a replayed write finds it again
    tags      step, group, sample index, prompt hash, kind (`train` or `eval`), the step's report
    root      the prompt in, the completion out; step, group, index, policy version, seed, run id
    spans     one per model turn (tokens, mean and minimum log-prob, entropy estimate, ended) and
              one per tool or environment call (arguments, result, error, seconds)
    feedback  each reward function's score, the total, the reward model's, and the advantage

Nothing here imports MLflow: `tracking.traces` turns records into MLflow's traces and writes them.
Nothing secret goes in: the texts are the model's and its tools', and any value of a secret-named
environment variable (a judge's API key, a token) that shows up in them is replaced (`redact`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.I)
MAX_TEXT = 20_000  # characters of one prompt, completion or tool result kept in a trace


def prompt_hash(prompt: str) -> str:
    """The key that lines up the same prompt across runs (`hindsight compare`, trace search)."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def trace_id(run_id: str, kind: str, step: int, index: int) -> str:
    """MLflow's `tr-` + 32 hex, the same for the same trajectory: writing it again replaces it."""
    return "tr-" + hashlib.sha256(f"{run_id}/{kind}/{step}/{index}".encode()).hexdigest()[:32]


def token_stats(logprobs: list[float]) -> dict:
    """Tokens, mean and minimum log-prob of a model turn, and its entropy estimate: the mean of
    -log p over tokens drawn from p is an unbiased estimate of the per-token entropy."""
    lps = [float(x) for x in logprobs if isinstance(x, (int, float)) and math.isfinite(x)]
    if not lps:
        return {"tokens": len(logprobs)}
    mean = sum(lps) / len(lps)
    return {"tokens": len(logprobs), "logprob_mean": round(mean, 6), "logprob_min": round(min(lps), 6),
            "entropy_estimate": round(-mean, 6)}


def _cut(text) -> str:
    text = "" if text is None else str(text)
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + f"… [{len(text) - MAX_TEXT} more characters]"


def _model_turns(row: dict) -> list[dict]:
    """A span per model turn, and one per tool or environment call, in order."""
    lps = list(row.get("logprobs") or [])
    if not row.get("turns"):  # one model turn: the whole completion
        return [{"name": "model turn 1", "type": "LLM", "inputs": {}, "outputs": {"text": _cut(row.get("completion"))},
                 "attributes": {**token_stats(lps), "ended": bool(row.get("ended_with_eos"))}}]
    spans, turns, n = [], json.loads(row["turns"]), 0
    for k, turn in enumerate(turns):
        if turn.get("role") == "assistant":
            n += 1
            ended = k + 1 < len(turns) or bool(row.get("ended_with_eos"))
            spans.append({"name": f"model turn {n}", "type": "LLM", "inputs": {},
                          "outputs": {"text": _cut(turn.get("text"))},
                          "attributes": {**token_stats(lps[turn["start"]:turn["end"]]), "ended": ended}})
        elif turn.get("calls"):
            for call in turn["calls"]:
                spans.append({"name": f"tool {call.get('tool') or '?'}", "type": "TOOL",
                              "inputs": {"arguments": call.get("arguments")},
                              "outputs": {"result": _cut(call.get("result"))},
                              "attributes": {"error": call.get("error") or "", "seconds": call.get("seconds")},
                              "error": call.get("error") or None})
        else:  # an environment's answer: no call, only what it said
            spans.append({"name": f"environment ({turn.get('role', '?')})", "type": "TOOL", "inputs": {},
                          "outputs": {"text": _cut(turn.get("text"))}, "attributes": {}})
    return spans


def _feedback(score: dict | None, advantage: float | None) -> dict:
    out = {}
    for key, value in (score or {}).items():
        if key == "reward" or key.startswith("reward_"):
            name = "reward" if key == "reward" else "reward/" + key[len("reward_"):]
            if isinstance(value, (int, float)) and math.isfinite(value):
                out[name] = float(value)
    if score and isinstance(score.get("rm_score"), (int, float)):
        out["reward/model"] = float(score["rm_score"])
    if isinstance(advantage, (int, float)) and math.isfinite(advantage):
        out["advantage"] = float(advantage)
    return out


def step_records(rows: list[dict], scores: list[dict], advantages: dict[int, float], step: int, run_id: str,
                 seed_of, budget: int, report: str | None = None) -> list[dict]:
    """Records of the first `budget` trajectories of RL step `step` (1-based; its shard is
    step - 1), whole groups first: a group's samples side by side is what a reader compares.
    `seed_of(group)` is the group's sampling seed."""
    by_index, size = {s["index"]: s for s in scores}, _size(rows)
    out = []
    for r in sorted(rows, key=lambda r: r["index"])[:max(budget, 0)]:
        prompt = str(r.get("prompt", ""))
        tags = {"hindsight.kind": "train", "hindsight.step": str(step), "hindsight.group": str(r["group"]),
                "hindsight.index": str(r["index"]), "hindsight.prompt_hash": prompt_hash(prompt),
                "hindsight.prompt_id": str(r.get("prompt_id", ""))}
        if report:
            tags["hindsight.report"] = report
        root = {"step": step, "group": r["group"], "index": r["index"], "sample": r["index"] - r["group"] * size,
                "policy_version": r.get("weights_version"), "seed": seed_of(r["group"]), "run_id": run_id,
                "ended": bool(r.get("ended_with_eos")), "cut": r.get("cut") or ""}
        out.append({"id": trace_id(run_id, "train", step, r["index"]), "name": f"step {step} · group {r['group']}",
                    "tags": tags, "inputs": {"prompt": _cut(prompt)}, "outputs": {"completion": _cut(r.get("completion"))},
                    "attributes": root, "spans": _model_turns(r),
                    "feedback": _feedback(by_index.get(r["index"]), advantages.get(r["index"]))})
    return out


def _size(rows: list[dict]) -> int:
    groups = {}
    for r in rows:
        groups[r["group"]] = groups.get(r["group"], 0) + 1
    return max(groups.values()) if groups else 1


def eval_records(answers: list[dict], step: int, run_id: str, cap: int) -> list[dict]:
    """Records of evaluation's greedy answers at `step` (0: before training), up to `cap`.
    Each answer is {"prompt", "answer", "correct", "ids"?}."""
    out = []
    for i, a in enumerate(answers[:max(cap, 0)]):
        prompt = str(a.get("prompt", ""))
        out.append({"id": trace_id(run_id, "eval", step, i), "name": f"eval · step {step} · #{i}",
                    "tags": {"hindsight.kind": "eval", "hindsight.step": str(step), "hindsight.index": str(i),
                             "hindsight.prompt_hash": prompt_hash(prompt)},
                    "inputs": {"prompt": _cut(prompt)}, "outputs": {"completion": _cut(a.get("answer"))},
                    "attributes": {"step": step, "index": i, "run_id": run_id, "greedy": True},
                    "spans": [{"name": "model turn 1", "type": "LLM", "inputs": {},
                               "outputs": {"text": _cut(a.get("answer"))},
                               "attributes": {"tokens": len(a.get("ids") or [])}}],
                    "feedback": {"correct": 1.0 if a.get("correct") else 0.0}})
    return out


def secret_values(environ=None) -> list[str]:
    """Values of environment variables whose names say they are secrets (long enough to matter)."""
    environ = os.environ if environ is None else environ
    return sorted({v for k, v in environ.items() if SECRET_NAME.search(k) and len(v) >= 8}, key=len, reverse=True)


def redact(record, secrets: list[str]):
    """The record with every secret value replaced, in every string at any depth."""
    if not secrets:
        return record
    if isinstance(record, str):
        for s in secrets:
            record = record.replace(s, "[redacted]")
        return record
    if isinstance(record, dict):
        return {k: redact(v, secrets) for k, v in record.items()}
    if isinstance(record, list):
        return [redact(v, secrets) for v in record]
    return record
