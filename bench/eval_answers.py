"""What the held-out evaluations of RL runs say, beyond accuracy: whether the gain is only form.

    python bench/eval_answers.py BEFORE.json AFTER.json [MORE.json ...] --tokenizer MODEL_FOLDER \
        [--references data-gsm8k/eval.jsonl]

Each file is an evaluation's greedy answers as an RL run keeps them (RUN_DIR/rl/evals/step-N.json).
For each it prints the accuracy and its standard error, the share of answers that ended (stopped
before the token budget: `eval.max_new_tokens`, from the run's decoding record beside the evals, or
--budget), the accuracy among those that ended, and the mean answer length in tokens; with
--references, the share whose last number is the reference's, however the answer marks it (a
form-free measure). Then the gain of each file over the first, with the standard error of the
difference paired by question (the same questions in the same order), and unpaired, the more
cautious one, for comparison.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number_right(answer: str, reference: str) -> bool:
    """Form-free correctness: the answer's last number is the reference's final one, however (or
    whether) the answer marks it."""
    got, want = _NUMBER.findall(answer.replace(",", "")), _NUMBER.findall(reference.replace(",", ""))
    return bool(got and want) and float(got[-1]) == float(want[-1])


def summary(answers: list[dict], lengths: list[int], budget: int, references: list[str] | None = None) -> dict:
    """Accuracy, SE, ended share, accuracy among ended, mean length of one evaluation, and with the
    references the share whose last number is right."""
    n = len(answers)
    correct = [1.0 if a["correct"] else 0.0 for a in answers]
    ended = [i for i, k in enumerate(lengths) if k < budget]
    acc = sum(correct) / n
    return {"n": n, "accuracy": acc, "se": math.sqrt(acc * (1 - acc) / n),
            "ended": len(ended) / n,
            "accuracy_ended": sum(correct[i] for i in ended) / len(ended) if ended else float("nan"),
            "tokens": sum(lengths) / n,
            "last_number": (sum(last_number_right(a["answer"], r) for a, r in zip(answers, references)) / n
                            if references else float("nan"))}


def paired_gain(before: list[dict], after: list[dict]) -> tuple[float, float, float]:
    """(gain, SE paired by question, SE unpaired) of `after`'s accuracy over `before`'s."""
    assert [a["prompt"] for a in before] == [a["prompt"] for a in after], "the evaluations ask different questions"
    n = len(before)
    d = [float(b["correct"]) - float(a["correct"]) for a, b in zip(before, after)]
    mean = sum(d) / n
    paired = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)
    p0, p1 = sum(a["correct"] for a in before) / n, sum(b["correct"] for b in after) / n
    return mean, paired, math.sqrt(p0 * (1 - p0) / n + p1 * (1 - p1) / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("evals", nargs="+", type=Path)
    ap.add_argument("--tokenizer", required=True, help="the model folder whose tokenizer counts answer tokens")
    ap.add_argument("--budget", type=int, default=None, help="eval.max_new_tokens (default: read from each run)")
    ap.add_argument("--references", type=Path, default=None,
                    help="the eval JSONL (its `answer` column, in eval order): adds the form-free column")
    args = ap.parse_args()
    refs = ([json.loads(line)["answer"] for line in args.references.read_text().splitlines() if line.strip()]
            if args.references else None)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    loaded = []
    for path in args.evals:
        answers = json.loads(path.read_text())["answers"]
        budget = args.budget or _budget(path)
        lengths = [len(tok(a["answer"], add_special_tokens=False)["input_ids"]) for a in answers]
        loaded.append((path, answers, summary(answers, lengths, budget, refs[:len(answers)] if refs else None)))
    print("| eval | accuracy | SE | ended | accuracy among ended | last number right | mean tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for path, _, s in loaded:
        print(f"| {path} | {s['accuracy']:.3f} | {s['se']:.3f} | {s['ended']:.3f} | {s['accuracy_ended']:.3f} "
              f"| {s['last_number']:.3f} | {s['tokens']:.1f} |")
    first = loaded[0]
    for path, answers, _ in loaded[1:]:
        gain, paired, unpaired = paired_gain(first[1], answers)
        print(f"gain {path} over {first[0]}: {gain:+.3f}  SE paired {paired:.3f} ({gain / paired:.1f} SE)  "
              f"SE unpaired {unpaired:.3f} ({gain / unpaired:.1f} SE)")


def _budget(path: Path) -> int:
    """eval.max_new_tokens of the run the evaluation belongs to, from the decoding record it keeps
    beside its evals (RUN_DIR/rl/decoding.json)."""
    record = path.parent.parent / "decoding.json"
    if not record.is_file():
        raise SystemExit(f"{path}: no {record} to read eval.max_new_tokens from; pass --budget")
    return json.loads(record.read_text())["eval"]["max_new_tokens"]

if __name__ == "__main__":
    main()
