"""Reward for model-written Python: 1.0 when its code passes the row's tests, run sandboxed."""
from __future__ import annotations

import re

from rewards import completion_text
from rewards.sandbox import run_python

_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def code_tests(completions, tests, timeout_s: float = 10.0, cpu_s: int = 5, memory_mb: int = 512, **_) -> list[float]:
    """`tests` (one per completion) is Python appended after the code, e.g. asserts."""
    scores = []
    for completion, test in zip(completions, tests):
        program = extract_code(completion_text(completion)) + "\n\n" + str(test) + "\n"
        result = run_python(program, timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb)
        scores.append(1.0 if result.ok else 0.0)
    return scores
