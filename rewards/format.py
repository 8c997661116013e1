"""Format rewards: does the completion follow a required structure?"""
from __future__ import annotations

import re

from rewards import completion_text

THINK_ANSWER = r"^\s*<think>.+?</think>\s*<answer>.+?</answer>\s*$"


def regex_reward(completions, pattern: str = THINK_ANSWER, **_) -> list[float]:
    rx = re.compile(pattern, re.DOTALL)
    return [1.0 if rx.search(completion_text(c)) else 0.0 for c in completions]


def think_answer_format(completions, **_) -> list[float]:
    """1.0 for '<think>...</think><answer>...</answer>' (the R1 format)."""
    return regex_reward(completions, THINK_ANSWER)


def number_only(completions, **_) -> list[float]:
    """The demo's format: the completion is just a number."""
    return regex_reward(completions, r"^\s*-?\d+\s*$")


def step_keywords(completions, keyword: str = "therefore", **_) -> list[float]:
    """The share of a completion's non-empty lines that carry `keyword` (any case): a step-format
    reward, and the design's example of one a policy games by repeating the keyword without
    reasoning. Pair it with a judge (`rewards.judge:judge`, as a second reward or with this as
    its `gate`), which reads whether the lines reason."""
    out = []
    for c in completions:
        steps = [line for line in completion_text(c).splitlines() if line.strip()]
        out.append(sum(keyword.lower() in line.lower() for line in steps) / len(steps) if steps else 0.0)
    return out
