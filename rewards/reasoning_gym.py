"""A reasoning-gym task's own verifier as a reward (TRL's contract): the completion's answer,
scored by the task that generated the row (`hindsight.data.procedural` keeps the whole entry in
the `rg_entry` column).

The answer is what the completion puts between `<answer>` and `</answer>` (reasoning-gym's own
format), else, for a task whose gold answer is a number, the last number in the completion, else
its last non-empty line. A small instruct model rarely uses the tags at first; the last number
lets it be scored on what it did compute.
"""
from __future__ import annotations

import json
import re

from rewards import completion_text

_TAGS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_answer(text: str, gold: str | None = None) -> str:
    tagged = _TAGS.findall(text)
    if tagged:
        return tagged[-1].strip()
    if gold is not None and _NUMBER.fullmatch(gold.strip().replace(",", "")):
        found = _NUMBER.findall(text.replace(",", ""))
        if found:
            return found[-1]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def rg_score(completions, rg_entry, **_) -> list[float]:
    """The task's score (0 to 1) of each completion's answer."""
    import reasoning_gym

    out = []
    for completion, raw in zip(completions, rg_entry):
        entry = json.loads(raw) if isinstance(raw, str) else raw
        scorer = reasoning_gym.get_score_answer_fn(entry["metadata"]["source_dataset"])
        answer = extract_answer(completion_text(completion), str(entry.get("answer")))
        out.append(float(scorer(answer=answer, entry=entry)))
    return out


def preflight(**_) -> None:
    import reasoning_gym  # noqa: F401  (the reward needs it: refused before the run when missing)


rg_score.preflight = preflight
