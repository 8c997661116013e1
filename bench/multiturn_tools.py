"""Multi-turn rollouts with a slow tool: trajectories per second with the tool calls of a turn
run one after another (`concurrency: 1`) against all at once (`concurrency: 8`), side by side.

    python bench/multiturn_tools.py [--trajectories 8] [--tool-s 0.5] [--turns 3] [--repeats 2]

The tiny Qwen2 tool model (`tiny://qwen2-tools`, built in code) samples every model turn; each
model turn is answered by one call of a tool that sleeps `--tool-s` seconds (as a search or a
remote sandbox does) and returns a number, for `--turns` model turns. The calls are scripted
(the random tiny model does not write tool calls), so what is measured is the rollout loop:
decoding every live trajectory at once, then every trajectory's tool calls. The tool runs in
process, so its 0.5 s is the tool's own time, not a sandbox's start-up.

The last line is `ratio trajectories_per_s concurrent/sequential: R` (goal: >= 3 at 8).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hindsight.models.load import load_causal_lm, load_tokenizer  # noqa: E402
from hindsight.models.source import resolve_model_path  # noqa: E402
from hindsight.models.tiny import teach_short_turns  # noqa: E402
from hindsight.rollout.multiturn.episodes import ToolEpisode  # noqa: E402
from hindsight.rollout.multiturn.loop import TurnSettings, run_trajectories  # noqa: E402
from hindsight.rollout.engines.hf import model_turns  # noqa: E402
from hindsight.rollout.multiturn.tools import Tool, ToolCall  # noqa: E402

SLEEP_S = 0.5


def lookup(key: int) -> int:
    """A slow lookup, as a search tool or a remote sandbox is.

    Args:
        key: What to look up.
    """
    time.sleep(SLEEP_S)
    return key * 2


class AlwaysCalls(ToolEpisode):
    """Every model turn is answered by one lookup call, whatever the model wrote."""

    def respond(self, text, calls, last=False):
        return super().respond(text, [ToolCall("lookup", {"key": len(text)})], last)


def run(model, tok, n: int, s: TurnSettings) -> tuple[float, int]:
    rows = [{"prompt": f"Look up {i}."} for i in range(n)]
    t0 = time.perf_counter()
    trajs, _ = run_trajectories(model, tok, rows, list(range(n)), 1, s, lambda: AlwaysCalls([Tool(lookup, "bench")]),
                                model_turns(model, tok.pad_token_id))
    calls = sum(len(t.get("calls", [])) for tr in trajs for t in tr.turns)
    return time.perf_counter() - t0, calls


def main() -> None:
    global SLEEP_S
    ap = argparse.ArgumentParser()
    ap.add_argument("--trajectories", type=int, default=8)
    ap.add_argument("--tool-s", type=float, default=0.5)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    SLEEP_S = args.tool_s
    path = resolve_model_path("tiny://qwen2-tools", Path(tempfile.mkdtemp()))
    tok = load_tokenizer(path)
    model = teach_short_turns(load_causal_lm(path, "float32"), tok)  # turns that end, so tools answer them
    base = dict(max_turns=args.turns, max_tokens=4000, max_new_tokens=8)
    seq, conc = [], []
    for _ in range(args.repeats):  # alternated, so a machine's drift lands on both
        for width, out in ((1, seq), (args.trajectories, conc)):
            wall, calls = run(model, tok, args.trajectories, TurnSettings(**base, concurrency=width))
            out.append(wall)
            print(f"concurrency {width}: {wall:.2f} s for {args.trajectories} trajectories, {calls} tool calls")
    s_tps, c_tps = args.trajectories / statistics.median(seq), args.trajectories / statistics.median(conc)
    print(f"trajectories_per_s sequential {s_tps:.2f}, concurrent {c_tps:.2f}")
    print(f"ratio trajectories_per_s concurrent/sequential: {c_tps / s_tps:.2f}")


if __name__ == "__main__":
    main()
