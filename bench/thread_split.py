"""Why async k = 1 gains what it gains on a CPU: each phase of a GRPO step at 1 and 2 threads.

    python bench/thread_split.py        # about 1 minute here

On one machine the sampler and the learner of `rl.async.max_staleness: 1` split the cores (one
thread each here), so an async step can be no shorter than the slower of the two at one
thread, while a sync step runs every phase at all threads. Prints each phase's median time at
1 and 2 threads on the long-completion bench task (the setting of bench/grpo_vs_trl.py), and the
ceiling that puts on the async/sync ratio: (sync kernel step) / max(learner, sampler at 1 thread),
and the ceiling of any schedule at all: (sync kernel step) / (half the phases' core-seconds).
"""
from __future__ import annotations

import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import grpo_vs_trl as bench  # noqa: E402


def _median_s(fn, repeats: int = 5) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def phases(kernel: bench.Kernel, rows: list[dict]) -> dict[str, float]:
    from hindsight.learning.update import update
    from hindsight.maths.logprobs import group_token_logprobs
    from hindsight.rollout.hf import sample_groups

    prompts = [r["prompt"] for r in rows[: bench.PROMPTS]]
    seeds = list(range(len(prompts)))

    def generate():
        return sample_groups(kernel.policy, kernel.tok, prompts, seeds, bench.SAMPLES, kernel.new_tokens, logprobs="decode")

    exp = generate()
    exp.rewards = torch.rand(len(exp))

    def reference():
        with torch.no_grad():
            return group_token_logprobs(kernel.ref, exp.input_ids, exp.attention_mask, exp.completion_ids.size(1),
                                        bench.SAMPLES)[0]

    exp.ref_logprobs = reference()
    return {"generate": _median_s(generate), "reference": _median_s(reference),
            "update": _median_s(lambda: update(kernel.policy, kernel.opt, copy.copy(exp), kernel.settings))}


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="hindsight-threads-"))
    init, rows = bench.setup(work, "sum")
    kernel = bench.Kernel(init, "sum")
    by_threads = {}
    for n in (1, 2):
        torch.set_num_threads(n)
        by_threads[n] = phases(kernel, rows)
        print(f"{n} thread(s): " + ", ".join(f"{k} {v:.3f}s" for k, v in by_threads[n].items()))
    one, two = by_threads[1], by_threads[2]
    print("scaling 1 -> 2 threads: " + ", ".join(f"{k} {one[k] / two[k]:.2f}x" for k in one))
    sync = sum(two.values())
    learner, sampler = one["update"], one["generate"] + one["reference"]
    print(f"sync kernel step (2 threads) {sync:.3f}s; async bound max(learner {learner:.3f}s, sampler {sampler:.3f}s) "
          f"at 1 thread each")
    print(f"ceiling async/sync with no orchestration at all: {sync / max(learner, sampler):.2f}x")
    # no schedule of these kernels on two cores beats half their 1-thread total: a phase never
    # costs fewer core-seconds at 2 threads than at 1 (the scaling above is at most 2x)
    perfect = sum(min(one[k], 2 * two[k]) for k in one) / 2
    print(f"ceiling with any split of the work over the two cores, perfectly balanced: {sync / perfect:.2f}x "
          f"(sync {sync:.3f}s against {perfect:.3f}s)")


if __name__ == "__main__":
    main()
