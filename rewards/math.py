"""Math answers checked by symbolic equivalence (HF math-verify, with a sympy fallback).

Handles \\boxed{}, fractions, decimals, LaTeX and answer sets ("x=2 or x=3" equals
"x=3, x=2"). GSM8K-style references ("... #### 42") are reduced to their final answer.
"""
from __future__ import annotations

import re

from rewards import completion_text


def _reference(answer: str) -> str:
    """The gold answer as math-verify expects to parse it: delimited. MATH-style datasets store
    bare LaTeX (`\\frac{1}{2}`, `\\pi`), which math-verify's LaTeX extraction does not find
    without `$...$`; GSM8K's final answer follows `####`."""
    answer = str(answer)
    if "####" in answer:
        answer = answer.split("####")[-1]
    answer = _THOUSANDS.sub("", answer.strip())
    return answer if answer.startswith("$") or "\\boxed" in answer else f"${answer}$"


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # 1,000 -> 1000; an interval's "(1, 3]" keeps its comma


def _set_of_values(text: str) -> set[str] | None:
    """'x=2 or x=3' / 'x = 3, x = 2' / '2 and 3' -> {'2', '3'}; None if not an answer set."""
    parts = re.split(r"\s*(?:,|\bor\b|\band\b)\s*", text.strip().strip("$"))
    values = [re.sub(r"^[a-zA-Z]\s*=\s*", "", p).strip() for p in parts if p.strip()]
    return set(values) if len(values) > 1 else None


def is_equivalent(prediction: str, reference: str) -> bool:
    """math-verify's verdict, with one deliberate difference: an answer set written without
    braces ("x=2 or x=3", "1, 2") is unordered here, while math-verify reads it as an ordered
    tuple; the order a model lists roots in is not an error."""
    from math_verify import parse, verify

    gold = parse(_reference(reference))
    pred = parse(prediction)
    if gold and pred and verify(gold, pred):
        return True
    pred_set, gold_set = _set_of_values(_last_answer(prediction)), _set_of_values(str(reference))
    if pred_set and gold_set and len(pred_set) == len(gold_set):
        return all(any(is_equivalent(f"${p}$", g) for g in gold_set) for p in pred_set)
    return False


def _last_answer(text: str) -> str:
    boxed = re.findall(r"\\boxed\{([^{}]*(?:\{[^{}]*\}[^{}]*)*)\}", text)
    return boxed[-1] if boxed else text


def math_answer(completions, answer, **_) -> list[float]:
    return [1.0 if is_equivalent(completion_text(c), a) else 0.0 for c, a in zip(completions, answer)]
