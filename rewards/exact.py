"""Exact-answer rewards: the demo's reads the first number of the completion, the worked-sum
bench task's (`hindsight/data/sumtask.py`) the last."""
from __future__ import annotations

import re

from rewards import completion_text

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def first_number(text: str) -> str | None:
    match = _NUMBER.search(text)
    return match.group(0) if match else None


def exact_answer(completions, answer, **_) -> list[float]:
    out = []
    for completion, target in zip(completions, answer):
        got = first_number(completion_text(completion))
        out.append(1.0 if got is not None and float(got) == float(target) else 0.0)
    return out


def final_answer(completions, answer, **_) -> list[float]:
    """1.0 when the last number in the completion equals the answer (a worked solution ends on it)."""
    out = []
    for completion, target in zip(completions, answer):
        numbers = _NUMBER.findall(completion_text(completion))
        out.append(1.0 if numbers and float(numbers[-1]) == float(target) else 0.0)
    return out
