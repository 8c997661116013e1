"""What the host pays when the code reward judges programs that return large values.

    python bench/code_reward_host.py [--programs 8] [--mb 1.0] [--timeout 10]

Each program returns a string of about `--mb` MB and its test checks the length; all are judged
at once (`parallel` = programs), each in its two sandboxes, in this process as the reward worker
runs them. The host's extra memory is its resident peak during the batch (VmHWM, reset first)
minus its resident memory before; the wall time is the batch's. A second batch holds an unused
module constant of 330,000 items in each program (the names line the host no longer parses).

Prints `ratio host_extra_mb/64: X` (goal <= 1) and `ratio wall_s/(timeout_s+1): Y` (goal <= 1).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(key)


def batch(programs: list[str], tests: list[str], timeout_s: float) -> tuple[list[float], float, float]:
    from rewards.code import code_tests

    Path("/proc/self/clear_refs").write_text("5")
    before, t0 = _kb("VmRSS"), time.perf_counter()
    scores = code_tests(programs, tests, timeout_s=timeout_s, parallel=len(programs))
    return scores, (_kb("VmHWM") - before) / 1024, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=8)
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=10.0)
    args = ap.parse_args()
    n, size = args.programs, int(args.mb * 1_000_000) - 10  # the literal's quotes stay within the 1 MB value cap
    batch(["def f():\n    return 1\n"], ["assert f() == 1\n"], args.timeout)  # warm: imports, the isolation probe
    large = [f"def f():\n    return 'x' * {size}\n"] * n
    scores, extra, wall = batch(large, [f"assert len(f()) == {size}\n"] * n, args.timeout)
    constant = [f"TABLE = list(range(330_000))\ndef f():\n    return 'x' * {size}\n"] * n
    scores2, extra2, wall2 = batch(constant, [f"assert len(f()) == {size}\n"] * n, args.timeout)
    print(f"{n} programs returning {size / 1e6:.2f} MB each, judged at once (timeout_s {args.timeout:g}):")
    print(f"  scores {scores}  host extra peak {extra:.1f} MB  wall {wall:.2f} s")
    print(f"  with an unused 330,000-item constant each: scores {scores2}  host extra peak {extra2:.1f} MB  "
          f"wall {wall2:.2f} s")
    print(f"ratio host_extra_mb/64: {max(extra, extra2) / 64:.2f}")
    print(f"ratio wall_s/(timeout_s+1): {max(wall, wall2) / (args.timeout + 1):.2f}")


if __name__ == "__main__":
    main()
