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
