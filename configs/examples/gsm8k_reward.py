"""The GSM8K-format recipe's reward, a file beside its config (`fn: gsm8k_reward:final_answer`).

GSM8K's convention, strictly: the completion's answer is the number after its last `####`, and it
scores 1 only when that number equals the reference's (the `answer` column, which ends `#### N`).
A completion that never writes `#### N` (cut at the token budget, or answering in prose) scores 0,
so the reward cannot be earned by a number that merely appears in the working.
"""
import re

from rewards import completion_text

_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def final_number(text: str) -> float | None:
    """The number after the last `####`, thousands commas dropped; None when there is none."""
    found = _FINAL.findall(text)
    return float(found[-1].replace(",", "")) if found else None


def final_answer(completions, answer, **_) -> list[float]:
    """1.0 for a completion whose `#### N` equals the reference's, else 0.0."""
    scores = []
    for completion, reference in zip(completions, answer):
        got, want = final_number(completion_text(completion)), final_number(str(reference))
        scores.append(1.0 if got is not None and want is not None and got == want else 0.0)
    return scores
