"""The long-completion bench task: a sum of three numbers, worked step by step.

    prompt:      "Q: 47+25+38= A: "
    completion:  "47+25=72;72+38=110."      (18-20 tokens: the tokenizer splits digits)

Sampling dominates a step here, as it does on real tasks (the demo's answers are 2-3 tokens).
The demonstrations carry the demo's kind of mistake, at every carry: an annotator drops the
carry into the tens in `carry_error` of the additions that need one, and a dropped carry in
the first line also spoils the second. So SFT leaves most carry problems wrong, greedy
decoding included, and a verifiable reward on the final number (`rewards.exact:final_answer`)
has far to climb: the algorithms do not all saturate within a short bench.
"""
from __future__ import annotations

import random
from pathlib import Path

from hindsight.data.rows import write_jsonl

FILES = ("prompts.jsonl", "eval.jsonl", "sft.jsonl")


def add_dropping_carry(a: int, b: int) -> int:
    """a + b with the carry out of the units dropped (47 + 25 -> 62)."""
    return a + b - 10 if (a % 10) + (b % 10) >= 10 else a + b


def worked(terms: list[int], add) -> tuple[str, int]:
    """The worked lines of a sum, each partial sum computed with `add`."""
    lines, total = [], terms[0]
    for t in terms[1:]:
        new = add(total, t)
        lines.append(f"{total}+{t}={new}")
        total = new
    return ";".join(lines) + ".", total


def sum_prompt(terms: list[int]) -> str:
    return "Q: " + "+".join(map(str, terms)) + "= A: "


def build_sum_data(out_dir: str | Path, seed: int = 0, carry_error: float = 0.7, n_prompts: int = 2000,
                   n_eval: int = 200, n_sft: int = 4000) -> dict[str, Path]:
    """Write prompts, eval and SFT files deterministically (same seed, same bytes)."""
    rng = random.Random(seed)
    seen_eval: set[tuple[int, ...]] = set()

    def terms() -> list[int]:
        return [rng.randint(10, 59) for _ in range(3)]

    evals = []
    while len(evals) < n_eval:
        t = terms()
        seen_eval.add(tuple(t))
        evals.append({"id": f"e{len(evals)}", "prompt": sum_prompt(t), "answer": str(sum(t))})

    def train_terms() -> list[int]:
        while tuple(t := terms()) in seen_eval:
            pass
        return t

    def annotator(a: int, b: int) -> int:
        return add_dropping_carry(a, b) if rng.random() < carry_error else a + b

    prompts = [{"id": f"p{i}", "prompt": sum_prompt(t), "answer": str(sum(t))}
               for i, t in enumerate(train_terms() for _ in range(n_prompts))]
    sft = [{"id": f"s{i}", "prompt": sum_prompt(t), "completion": worked(t, annotator)[0]}
           for i, t in enumerate(train_terms() for _ in range(n_sft))]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in zip(FILES, (prompts, evals, sft)):
        write_jsonl(out / name, rows)
    return {name: out / name for name in FILES}
