"""The deterministic demo task, and the demo data files built from it.

The demo task is addition written as a one-line word problem ("Ann has 40 pens and gets
13 more. How many pens now?"). The human demonstrations carry a systematic mistake: when
the added amount has a tens digit, most annotators dropped it (40 + 13 -> "43"). SFT imitates the
majority, so greedy decoding after SFT gets carry problems wrong, while sampling still
finds the right answer often enough for a verifiable reward to pull the policy towards it.
"""
from __future__ import annotations

import random
from pathlib import Path

from hindsight.data.rows import write_jsonl

NAMES = ["Ann", "Bob", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jo"]
ITEMS = ["pens", "cats", "cups", "eggs", "hats", "jars", "keys", "maps", "nuts", "owls"]
VERBS = ["gets", "finds", "buys", "wins"]
DEMO_FILES = ("prompts.jsonl", "eval.jsonl", "sft.jsonl", "prefs.jsonl")


def demo_prompt(a: int, b: int, rng: random.Random) -> str:
    name, item, verb = rng.choice(NAMES), rng.choice(ITEMS), rng.choice(VERBS)
    return f"{name} has {a} {item} and {verb} {b} more. How many {item} now? A: "


def forgot_carry(a: int, b: int) -> int:
    """The annotators' mistake: add the units of `b` but drop its ten."""
    return a + b % 10


def needs_carry(a: int, b: int) -> bool:
    return b >= 10


def build_demo_data(out_dir: str | Path, seed: int = 0, error_rate: float = 0.6,
                    n_prompts: int = 1000, n_eval: int = 200, n_sft: int = 3000,
                    n_prefs: int = 1500) -> dict[str, Path]:
    """Regenerate the four demo files deterministically (same seed, same bytes)."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10, 100, 10) for b in range(1, 20)]
    rng.shuffle(pairs)
    eval_pairs, train_pairs = pairs[:36], pairs[36:]  # eval sums never appear in training

    def task_row(a, b, idx):
        return {"id": idx, "prompt": demo_prompt(a, b, rng), "answer": str(a + b)}

    def demo_answer(a, b):
        return forgot_carry(a, b) if needs_carry(a, b) and rng.random() < error_rate else a + b

    prompts = [task_row(*rng.choice(train_pairs), f"p{i}") for i in range(n_prompts)]
    evals = [task_row(*rng.choice(eval_pairs), f"e{i}") for i in range(n_eval)]
    sft = []
    for i in range(n_sft):
        a, b = rng.choice(train_pairs)
        sft.append({"id": f"s{i}", "prompt": demo_prompt(a, b, rng), "completion": str(demo_answer(a, b))})
    prefs = []
    for i in range(n_prefs):
        a, b = rng.choice(train_pairs)
        wrong = forgot_carry(a, b) if needs_carry(a, b) else a + b + rng.choice([-10, 10, 1, -1])
        prefs.append({"id": f"r{i}", "prompt": demo_prompt(a, b, rng),
                      "chosen": str(a + b), "rejected": str(wrong)})

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = dict(zip(DEMO_FILES, (prompts, evals, sft, prefs)))
    for name, rows in files.items():
        write_jsonl(out / name, rows)
    return {name: out / name for name in files}


def demo_data(name: str):
    """(the files, the builder) of the demo data set `name` (`data.demo`: sums, tool_sums,
    gsm8k_format)."""
    if name == "gsm8k_format":
        from hindsight.data.wordproblems import FILES, build_word_problems

        return FILES, build_word_problems
    if name == "tool_sums":
        from hindsight.data.toolsums import FILES, build_tool_data

        return FILES, build_tool_data
    if name != "sums":
        raise ValueError(f"{name!r}: no such demo data (sums, tool_sums, gsm8k_format)")
    return DEMO_FILES, build_demo_data
