"""GSM8K-format word problems, generated in code (`data.demo: gsm8k_format`).

The same shape as GSM8K: a `question`, and an `answer` that works the problem out a line a step and
ends `#### N`. Five kinds, one or two steps: add, subtract, multiply, divide (exactly), and
multiply-then-subtract. Numbers stay small enough for a 135 M model to do the arithmetic now and
then, so that sampling finds right answers for a verifiable reward to reinforce.

Files (JSONL, a row a line):
- `prompts.jsonl` (600): RL's training questions, with the worked `answer` the reward reads;
- `eval.jsonl` (200): held out; no eval question's numbers are trained on (a split by the numbers);
- `sft.jsonl` (300): demonstrations of the answer's form (`question`, `answer` as the completion),
  drawn from the training side, for an optional warm-up.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from pathlib import Path

from hindsight.data.rows import write_jsonl

FILES = ("prompts.jsonl", "eval.jsonl", "sft.jsonl")
NAMES = ["Mia", "Tom", "Ana", "Raj", "Lea", "Sam", "Zoe", "Ben", "Ivy", "Omar", "Kai", "Nina"]
ITEMS = ["apples", "stickers", "pencils", "marbles", "cookies", "cards", "shells", "books", "coins", "stamps"]
HOLDERS = ["box", "bag", "jar", "pack", "tray"]
KINDS = ("add", "sub", "mul", "div", "mul_sub")


def _add(rng: random.Random) -> tuple[tuple, str, list[str], int]:
    a, b = rng.randrange(10, 80), rng.randrange(2, 50)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    q = f"{name} has {a} {item}. {name} buys {b} more. How many {item} does {name} have now?"
    return ("add", a, b), q, [f"{a} + {b} = {a + b}"], a + b


def _sub(rng: random.Random) -> tuple[tuple, str, list[str], int]:
    a = rng.randrange(20, 99)
    b = rng.randrange(2, a - 1)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    q = f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?"
    return ("sub", a, b), q, [f"{a} - {b} = {a - b}"], a - b


def _mul(rng: random.Random) -> tuple[tuple, str, list[str], int]:
    a, b = rng.randrange(2, 13), rng.randrange(2, 10)
    item, holder = rng.choice(ITEMS), rng.choice(HOLDERS)
    q = f"Each {holder} holds {a} {item}. How many {item} are in {b} {holder}s?"
    return ("mul", a, b), q, [f"{a} * {b} = {a * b}"], a * b


def _div(rng: random.Random) -> tuple[tuple, str, list[str], int]:
    each, b = rng.randrange(2, 13), rng.randrange(2, 10)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    q = f"{name} shares {each * b} {item} equally among {b} friends. How many {item} does each friend get?"
    return ("div", each * b, b), q, [f"{each * b} / {b} = {each}"], each


def _mul_sub(rng: random.Random) -> tuple[tuple, str, list[str], int]:
    a, b = rng.randrange(2, 10), rng.randrange(2, 10)
    c = rng.randrange(1, a * b)
    name, item, holder = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(HOLDERS)
    q = (f"{name} buys {a} {holder}s of {item} with {b} {item} in each {holder}, then gives away {c} {item}. "
         f"How many {item} does {name} have left?")
    return ("mul_sub", a, b, c), q, [f"{a} * {b} = {a * b}", f"{a * b} - {c} = {a * b - c}"], a * b - c


MAKERS: dict[str, Callable] = {"add": _add, "sub": _sub, "mul": _mul, "div": _div, "mul_sub": _mul_sub}


def worked_answer(steps: list[str], n: int) -> str:
    """GSM8K's answer form: the working a line a step, then `#### N`."""
    return "\n".join(steps) + f"\n#### {n}"


def held_out(key: tuple, fraction: float = 0.25) -> bool:
    """Whether a problem's numbers belong to the eval side: a hash of the numbers, so the split does
    not depend on the order problems are drawn in, and no eval problem is ever trained on."""
    digest = hashlib.sha256(repr(key).encode()).digest()
    return digest[0] < 256 * fraction


def draw(rng: random.Random, n: int, eval_side: bool, seen: set) -> list[tuple[tuple, str, str]]:
    """`n` distinct questions of one side of the split, the kinds in turn. Distinct by their text:
    one-digit products have fewer number pairs than a side needs, so names and items vary them."""
    rows: list[tuple[tuple, str, str]] = []
    while len(rows) < n:
        key, question, steps, answer = MAKERS[KINDS[len(rows) % len(KINDS)]](rng)
        if held_out(key) != eval_side or question in seen:
            continue
        seen.add(question)
        rows.append((key, question, worked_answer(steps, answer)))
    return rows


def build_word_problems(out_dir: str | Path, seed: int = 0, n_prompts: int = 600, n_eval: int = 200,
                        n_sft: int = 300) -> dict[str, Path]:
    """Write the three files deterministically (same seed, same bytes)."""
    rng = random.Random(seed)
    seen: set = set()
    train = draw(rng, n_prompts + n_sft, eval_side=False, seen=seen)
    evals = draw(rng, n_eval, eval_side=True, seen=seen)
    files = {
        "prompts.jsonl": [{"id": f"p{i}", "question": q, "answer": a} for i, (_, q, a) in enumerate(train[:n_prompts])],
        "eval.jsonl": [{"id": f"e{i}", "question": q, "answer": a} for i, (_, q, a) in enumerate(evals)],
        # the demonstrations are problems RL never sees, so the warm-up teaches the form, not the answers
        "sft.jsonl": [{"id": f"s{i}", "question": q, "answer": a} for i, (_, q, a) in enumerate(train[n_prompts:])],
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        write_jsonl(out / name, rows)
    return {name: out / name for name in files}
