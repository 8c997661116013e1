"""The run directory is one object: every path of a run comes from `state.rundir`, so no other
module spells a run file's name (a scan of the source says so), and the run context reaches a
reward as an argument, never through the environment."""
import re
from pathlib import Path

from hindsight.state.rundir import RLDir, RunContext, RunDir

ROOT = Path(__file__).resolve().parents[3]
# the names of a run's files and folders, as a module would spell them by hand
PATHS = re.compile(r'/ *"(rl|checkpoints|ledger|reports|plots|export|judge)"')


def test_no_module_builds_a_run_path_by_hand():
    found = []
    for pkg in ("hindsight", "rewards", "tracking", "tasks", "flows", "cli"):
        for path in (ROOT / pkg).rglob("*.py"):
            if path.name == "rundir.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if PATHS.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []


def test_every_path_is_under_its_run(tmp_path):
    run = RunDir(tmp_path / "runs" / "demo")
    rl = run.rl
    assert rl.path == tmp_path / "runs/demo/rl" and run.stage("sft") == tmp_path / "runs/demo/sft"
    assert rl.checkpoints == rl.path / "checkpoints" and rl.report(7) == rl.path / "reports/step-000007.html"
    assert run.spool == tmp_path / "runs/demo/mlflow-spool"
    (tmp_path / "runs/demo/rl").mkdir(parents=True)
    assert RLDir.find(tmp_path / "runs/demo").path == rl.path == RLDir.find(rl.path).path
    assert rl.context() == RunContext(run_dir=str(rl.path), cache_dir=str(rl.path))


def test_the_run_context_reaches_a_reward_that_asks_for_it(tmp_path):
    from hindsight.scoring.rewards import score_completions

    seen = {}

    def with_context(completions, run_context, **_):
        seen["ctx"] = run_context
        return [1.0] * len(completions)

    def plain(completions, **kwargs):
        seen["plain"] = sorted(kwargs)
        return [1.0] * len(completions)

    import sys
    import types

    module = types.ModuleType("ctx_rewards")
    module.with_context, module.plain = with_context, plain
    sys.modules["ctx_rewards"] = module
    ctx = RLDir(tmp_path).context()
    score_completions([("ctx_rewards:with_context", 1.0), ("ctx_rewards:plain", 1.0)], ["a"], {"answer": ["1"]},
                      context=ctx)
    assert seen["ctx"] == ctx and seen["plain"] == ["answer"]  # TRL's contract, nothing more
    assert ctx.cache_for("judge") == str(tmp_path / "judge")
    assert "HINDSIGHT_RUN_DIR" not in (ROOT / "hindsight/coordination/run.py").read_text()
