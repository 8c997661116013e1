"""What the judge costs an RL step of the GSM8K-format recipe, measured side by side in one run.

    python bench/judge_step_cost.py [--model FOLDER] [--rounds 3] [--step-s SECONDS]

A step of the recipe scores 32 completions (4 prompts x 8 samples). This scores the same 32
completions with the recipe's reward alone (gsm8k_reward.py, the number after `####`) and with
`rewards.judge:judge` beside it, rounds alternating the order, no verdict cache (every completion is
a request), against `transformers serve` on 127.0.0.1 with continuous batching. The judge is the tiny
stand-in trained in code, or `--model`: a real one, such as the SmolLM2 folder the recipe imports
(.hindsight/models/gguf-*). The completions are the training file's worked answers. `--step-s`
(a step's wall time without the judge, from the run's `time/*` metrics) prints the judge's share.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from judge_throughput import _port, _serve  # noqa: E402

RUBRIC = ("Question: {prompt}\nAnswer: {completion}\nDoes the answer work the problem out, or only repeat "
          "words? Reply `score: 1` if it works it out, `score: 0` if not.")


def _completions(n: int) -> tuple[list[str], list[str], list[str]]:
    """(questions, completions, references): the recipe's demonstrations, as a step would score them."""
    import json

    from hindsight.data.wordproblems import build_word_problems

    with tempfile.TemporaryDirectory() as d:
        rows = [json.loads(x) for x in build_word_problems(d)["sft.jsonl"].read_text().splitlines()[:n]]
    return [r["question"] for r in rows], [r["answer"] for r in rows], [r["answer"] for r in rows]


UNPARSED: list[int] = []  # the judge's verdicts that were not `score: N` (they get the fallback)


def _score(specs, prompts, completions, answers) -> float:
    from hindsight.scoring.rewards import score_completions

    t0 = time.perf_counter()
    result = score_completions(specs, completions, {"answer": answers}, -1.0, prompts=prompts)
    dt = time.perf_counter() - t0
    UNPARSED.append(result.failures.get("judge", 0))
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="the judge's model folder (default: the tiny stand-in)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--completions", type=int, default=32)
    ap.add_argument("--step-s", type=float, default=None, help="a step's wall time without the judge")
    a = ap.parse_args()
    from hindsight.config.rl import RewardFnConfig
    from hindsight.models.tiny import build_tiny_judge

    spec = importlib.util.spec_from_file_location("gsm8k_reward", ROOT / "configs/examples/gsm8k_reward.py")
    sys.modules["gsm8k_reward"] = module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    prompts, completions, answers = _completions(a.completions)
    with tempfile.TemporaryDirectory() as work:
        model = a.model or build_tiny_judge(Path(work) / "judge")
        port = _port()
        with open(Path(work) / "serve.log", "w") as log:
            proc = _serve(model, port, log, batching=True)
            try:
                args = {"base_url": f"http://127.0.0.1:{port}/v1", "model": str(model), "rubric": RUBRIC,
                        "max_tokens": 8, "concurrency": 8, "timeout_s": 120}
                alone = [RewardFnConfig.model_validate({"fn": "gsm8k_reward:final_answer"})]
                judged = alone + [RewardFnConfig.model_validate({"fn": "rewards.judge:judge", "weight": 0.5,
                                                                 "args": args})]
                _score(judged, prompts[:4], completions[:4], answers[:4])  # warm-up
                times: dict[str, list[float]] = {"alone": [], "judged": []}
                for r in range(a.rounds):
                    tag = [f"(round {r}) " + p for p in prompts]  # new texts each round: no cached verdict
                    for name in (("alone", "judged") if r % 2 == 0 else ("judged", "alone")):
                        times[name].append(_score(alone if name == "alone" else judged, tag, completions, answers))
            finally:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=30)
    t0, t1 = statistics.median(times["alone"]), statistics.median(times["judged"])
    print(f"scoring {a.completions} completions (median of {a.rounds} rounds), judge {model.name}: "
          f"reward alone {t0:.2f} s, with the judge {t1:.2f} s, added {t1 - t0:.2f} s a step; "
          f"{sum(UNPARSED)} of {4 + a.completions * a.rounds} verdicts unparsed (scored as the fallback)")
    if a.step_s:
        print(f"ratio step_s with_judge/without: {(a.step_s + t1 - t0) / a.step_s:.3f}")


if __name__ == "__main__":
    main()
