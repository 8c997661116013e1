"""The judge reward's requests per second at concurrency 1 against 8, side by side in one run,
against a real `transformers serve` on loopback serving the tiny judge (trained in code).

    python bench/judge_throughput.py [--texts 48] [--rounds 3] [--continuous-batching]   # ~a minute

Each round scores fresh distinct texts once per concurrency, in alternating order, with no
cache (every text is a request). Without `--continuous-batching`, `transformers serve`
generates one request at a time, so concurrency only overlaps HTTP and tokenising (1.07x
here); with it, concurrent requests decode in one batch (2.10x here, docs/benchmarks.md), as a
vLLM or SGLang judge does.
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hindsight.models.tiny import build_tiny_judge  # noqa: E402
from rewards.judge import judge  # noqa: E402

RUBRIC = "Question: {prompt}\nAnswer: {completion}\nIs it right? Reply `score: 1` or `score: 0`."


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(model: Path, port: int, log, batching: bool) -> subprocess.Popen:
    extra = ["--continuous-batching"] if batching else []
    proc = subprocess.Popen([sys.executable, "-m", "transformers.cli.transformers", "serve", str(model), "--host",
                             "127.0.0.1", "--port", str(port), "--device", "cpu", *extra], stdout=log, stderr=log,
                            start_new_session=True)
    for _ in range(360):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("transformers serve did not come up")


def _rate(base_url: str, model: str, texts: int, concurrency: int, round_: int) -> float:
    prompts = [f"round {round_} concurrency {concurrency} question {i}: Ann has {i} pens" for i in range(texts)]
    t0 = time.perf_counter()
    scores = judge(completions=[str(i) for i in range(texts)], prompts=prompts, base_url=base_url, model=model,
                   rubric=RUBRIC, concurrency=concurrency, max_tokens=8, cache_dir=None)
    dt = time.perf_counter() - t0
    assert all(s == 1.0 for s in scores), scores  # every request answered and parsed
    return texts / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--texts", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--continuous-batching", action="store_true", help="serve with transformers' continuous batching")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        model = build_tiny_judge(Path(work) / "judge")
        port = _port()
        with open(Path(work) / "serve.log", "w") as log:
            proc = _serve(model, port, log, a.continuous_batching)
            try:
                base = f"http://127.0.0.1:{port}/v1"
                _rate(base, str(model), 4, 1, -1)  # warm-up
                rates: dict[int, list[float]] = {1: [], 8: []}
                for r in range(a.rounds):
                    for c in ((1, 8) if r % 2 == 0 else (8, 1)):
                        rates[c].append(_rate(base, str(model), a.texts, c, r))
            finally:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=30)
    one, eight = statistics.median(rates[1]), statistics.median(rates[8])
    mode = "continuous batching" if a.continuous_batching else "one request at a time"
    print(f"judge requests/s ({mode}; median of {a.rounds} rounds, {a.texts} texts each): concurrency 1 {one:.1f}, "
          f"concurrency 8 {eight:.1f}")
    print(f"ratio judge req/s c8/c1: {eight / one:.2f}")


if __name__ == "__main__":
    main()
