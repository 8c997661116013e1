"""The multi-turn demo's task: 3-digit sums a tiny model cannot add alone but can hand to an
`add(a, b)` tool (configs/demo-tools.yaml), and guess-a-number rows (configs/demo-guess.yaml).

SFT rows are tool-use traces in TRL's conversational form with a `tools` column: the user's
question, the assistant's `add` call, the tool's result, and the answer. A share of them are
wrong the way an annotator is wrong: an operand copied with two digits swapped, so the tool
answers another sum and the trace repeats it; and some answer without the tool, dropping a
carry. RL on the exact answer has that to unlearn.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from hindsight.data.rows import write_jsonl

FILES = ("prompts.jsonl", "eval.jsonl", "sft.jsonl", "prefs.jsonl", "guess.jsonl", "guess-eval.jsonl",
         "sft-guess.jsonl")
GUESS = "Let's play."
ADD_SCHEMA = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "The first number."},
                                                    "b": {"type": "integer", "description": "The second number."}},
                   "required": ["a", "b"]}, "return": {"type": "integer"}}}


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def swapped(n: int, rng: random.Random) -> int:
    """n with two of its digits swapped (a copying slip), or n+10 when they are equal."""
    d = list(str(n))
    i, j = rng.sample(range(len(d)), 2)
    d[i], d[j] = d[j], d[i]
    out = int("".join(d))
    return out if out != n else n + 10


def no_carry(a: int, b: int) -> int:
    return int("".join(str((int(x) + int(y)) % 10) for x, y in zip(f"{a:03d}", f"{b:03d}")))


def trace(a: int, b: int, rng: random.Random, error_rate: float) -> list[dict]:
    if rng.random() < error_rate / 2:  # answered without the tool: every carry dropped
        return [{"role": "assistant", "content": str(no_carry(a, b))}]
    x, y = (swapped(a, rng), b) if rng.random() < error_rate / 2 else (a, b)
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": x, "b": y}}}
    return [{"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "add", "content": str(x + y)},
            {"role": "assistant", "content": str(x + y)}]


def guess_trace(secret: int, rng: random.Random) -> list[dict]:
    """A game played the slow way: a first guess at random, then one step at a time towards the
    number as the hints say (5.5 guesses on average from 0, 1.5 + 1 from 4 or 5; 4.3 over a random
    start). RL on a reward that falls with each turn has a better first guess to find."""
    guess, turns = rng.randint(0, 9), []
    while True:
        turns.append({"role": "assistant", "content": str(guess)})
        if guess == secret:
            return turns
        hint = "higher" if guess < secret else "lower"
        turns.append({"role": "user", "content": hint})
        guess += 1 if hint == "higher" else -1


def build_tool_data(out_dir: str | Path, seed: int = 0, error_rate: float = 0.1, n_prompts: int = 1000,
                    n_eval: int = 200, n_sft: int = 16000, n_sft_guess: int = 8000) -> dict[str, Path]:
    """Regenerate the files deterministically (same seed, same bytes). Eval sums never appear in
    training; prefs (pairs for the reward model stage) prefer the right answer."""
    rng = random.Random(seed)
    pairs = [(rng.randrange(100, 1000), rng.randrange(100, 1000)) for _ in range(20000)]
    eval_pairs, train_pairs = pairs[:n_eval], pairs[n_eval:]
    row = lambda a, b, i: {"id": i, "prompt": question(a, b), "answer": str(a + b), "secret": (a + b) % 10}  # noqa: E731
    files = {
        "prompts.jsonl": [row(*rng.choice(train_pairs), f"p{i}") for i in range(n_prompts)],
        "eval.jsonl": [row(a, b, f"e{i}") for i, (a, b) in enumerate(eval_pairs)],
        "sft.jsonl": [{"id": f"s{i}", "prompt": [{"role": "user", "content": question(a, b)}],
                       "completion": trace(a, b, rng, error_rate), "tools": json.dumps([ADD_SCHEMA])}
                      for i, (a, b) in enumerate(rng.choice(train_pairs) for _ in range(n_sft))],
        "prefs.jsonl": [{"id": f"r{i}", "prompt": question(a, b), "chosen": str(a + b), "rejected": str(no_carry(a, b))}
                        for i, (a, b) in enumerate(rng.choice(train_pairs) for _ in range(200))],
        "guess.jsonl": [{"id": f"g{i}", "prompt": GUESS, "secret": rng.randrange(10), "answer": "0"}
                        for i in range(n_prompts)],
        "guess-eval.jsonl": [{"id": f"ge{i}", "prompt": GUESS, "secret": i % 10, "answer": "0"} for i in range(100)],
        "sft-guess.jsonl": [{"id": f"sg{i}", "prompt": [{"role": "user", "content": GUESS + " Guess my number from 0 "
                                                         "to 9."}], "completion": guess_trace(i % 10, rng)}
                            for i in range(n_sft_guess)],
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        write_jsonl(out / name, rows)
    return {name: out / name for name in files}
