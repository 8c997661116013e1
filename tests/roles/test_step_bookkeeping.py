"""A step's bookkeeping does not grow with the run (issue 36's soak: step times climbed over 600
tiny steps). Every file a step opens (rollout, scoring, update, and the metric history and alert
rules the flow runs after it), lists or stats is counted with an audit hook, step by step,
in one process: step 30 touches exactly the files step 5 does (by kind and path, step numbers
folded), so nothing reads or lists what accumulates (ledger, shards, metrics, history)."""
import collections
import re
import sys

from helpers import rl_cfg, tiny_init
from hindsight.coordination.run import RLRun

EVENTS = ("open", "os.listdir", "os.scandir", "glob.glob", "os.stat", "os.walk")
_seen: list | None = None


def _hook(name, args):
    if _seen is not None and name in EVENTS:
        _seen.append((name, str(args[0]) if args else ""))


sys.addaudithook(_hook)  # audit hooks cannot be removed: it records only while `_seen` is a list


def _step_files(run: RLRun, step: int, root: str) -> collections.Counter:
    global _seen
    _seen = []
    try:
        run.rollout(step), run.score(step)
        out = run.update(step)
        # what the flow does after each step (flows/rl.py `_watch`): the history on disk and the alert rules
        run.observe(step + 1, {k: v for k, v in out.items() if isinstance(v, (int, float))})
    finally:
        events, _seen = _seen, None
    fold = lambda p: re.sub(r"\d+", "N", p.replace(root, "RUN"))  # noqa: E731  (step-000005 and step-000030 alike)
    return collections.Counter((name, fold(path)) for name, path in events if root in path)


def test_a_late_step_touches_the_files_an_early_one_does(tmp_path):
    cfg = rl_cfg(tmp_path, steps=32, prompts_per_step=2, samples_per_prompt=2, init=str(tiny_init(tmp_path)),
                 eval_every=10**6, save_every=10**6, report_every=10**6)
    run = RLRun(cfg, cfg.rl.init, None)
    root = str(tmp_path)
    try:
        per_step = {step: _step_files(run, step, root) for step in range(31)}  # the last step (31) would checkpoint
    finally:
        run.close()
    early, late = per_step[5], per_step[30]
    assert sum(early.values()) > 0, "nothing was recorded: the hook saw no file of the run"
    grown = {k: (early[k], late[k]) for k in set(early) | set(late) if early[k] != late[k]}
    assert not grown, f"files touched at step 5 vs step 30 (kind, path): {grown}"
