"""The run directory is one object: every path of a run comes from `state.rundir`, so no other
module spells a run file's name (a scan of the source says so), and the run context reaches a
reward as an argument, never through the environment."""
import json
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


# --- the run directory is hindsight's alone ----------------------------------------------------
import os  # noqa: E402

import pytest  # noqa: E402

from hindsight.errors import ConfigError  # noqa: E402


def test_a_new_folder_is_made_and_marked_with_hindsights_first_folder_and_an_empty_one_taken(tmp_path):
    run = RunDir(tmp_path / "runs/a").claim()
    assert run.root.is_dir() and not run.mark.exists()  # a run refused right after leaves no file
    run.record("sft")
    assert run.mark.is_file() and run.made() == ["sft"]
    (tmp_path / "empty").mkdir()
    assert RunDir(tmp_path / "empty").claim().record("rl") == tmp_path / "empty/rl"


def test_a_folder_with_files_hindsight_did_not_make_is_refused_and_untouched(tmp_path):
    user = tmp_path / "home-like"
    for rel in (".notes.md.tmp-4242", "docs/.report.tmp-77", "rl/mine.txt"):
        (user / rel).parent.mkdir(parents=True, exist_ok=True)
        (user / rel).write_text("mine")
    before = sorted(p.relative_to(user) for p in user.rglob("*"))
    with pytest.raises(ConfigError, match=r"not a hindsight run directory: it holds files hindsight did not make "
                                          r"\(.notes.md.tmp-4242, docs\)"):
        RunDir(user).claim()
    assert sorted(p.relative_to(user) for p in user.rglob("*")) == before


def test_an_older_hindsights_run_directory_is_adopted(tmp_path):
    old = tmp_path / "runs/old"
    (old / "rl" / "checkpoints").mkdir(parents=True)
    (old / "sft").mkdir()
    run = RunDir(old).claim()
    assert run.made() == ["rl", "sft"]


@pytest.mark.parametrize("where", ["home", "cwd", "above-cwd"])
def test_home_the_working_directory_and_above_are_refused(tmp_path, monkeypatch, where):
    work = tmp_path / "work" / "project"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    target = {"home": tmp_path / "home", "cwd": work, "above-cwd": tmp_path / "work"}[where]
    with pytest.raises(ConfigError, match="home folder|working directory or a folder above it"):
        RunDir(target).claim()
    assert not (target / ".hindsight-run").exists()


def test_the_sweep_and_force_touch_only_what_hindsight_made(tmp_path):
    run = RunDir(tmp_path / "run").claim()
    rl = run.record("rl")
    (rl / "checkpoints").mkdir(parents=True)
    (rl / "checkpoints" / ".manifest.json.tmp-999999").write_text("{half")
    (run.root / "..hindsight-run.tmp-999998").write_text("{half")  # the atomic write of the mark
    (run.root / "notes").mkdir()  # put there later by the user
    (run.root / "notes" / ".draft.md.tmp-5").write_text("the user's")
    removed = run.sweep_temporaries()
    assert sorted(p.name for p in removed) == ["..hindsight-run.tmp-999998", ".manifest.json.tmp-999999"]
    assert (run.root / "notes" / ".draft.md.tmp-5").exists()
    (run.root / "sft").mkdir()  # not recorded: not moved
    with pytest.raises(ConfigError, match="hindsight did not make this folder"):
        run.move_aside("sft")
    assert (run.root / "sft").is_dir() and run.move_aside("rl").name.startswith("rl.old-")
    assert os.listdir(run.root / "notes") == [".draft.md.tmp-5"]


# --- a run directory proves it is one ----------------------------------------------------------
def _user_folder(tmp_path):
    """A user's folder with their own temporaries in folders named like hindsight's."""
    user = tmp_path / "user"
    for rel in ("rl/.notes.md.tmp-4242", "sft/.draft.tmp-77", "src/main.py"):
        (user / rel).parent.mkdir(parents=True, exist_ok=True)
        (user / rel).write_text("mine")
    return user


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("mark", ['{"made": ["rl", "sft"]}', '{"made": ["../../victim"]}', "not json"])
def test_a_hand_written_mark_does_not_make_a_users_folder_a_run_directory(tmp_path, mark):
    user = _user_folder(tmp_path)
    (user / ".hindsight-run").write_text(mark)
    (tmp_path / "victim").write_text("outside")
    before = _files(user)
    with pytest.raises(ConfigError, match="not a hindsight run directory|not a run-directory mark"):
        RunDir(user).claim()
    assert _files(user) == before and (tmp_path / "victim").exists()
    assert RunDir(user).sweep_temporaries() == [] and _files(user) == before


def test_a_mark_edited_by_hand_is_one_error_line(tmp_path):
    run = RunDir(tmp_path / "run").claim()
    run.record("rl")
    mark = json.loads(run.mark.read_text())
    run.mark.write_text(json.dumps({**mark, "made": ["rl", "../../victim"]}))
    with pytest.raises(ConfigError, match=r"\.hindsight-run: not a run-directory mark hindsight wrote: its checksum "
                                          r"does not match its content"):
        RunDir(run.root).claim()
    from hindsight.state.rundir import signed
    run.mark.write_text(json.dumps(signed({**mark, "made": ["rl", "../../victim"]})))  # re-signed: still not a name
    with pytest.raises(ConfigError, match="names folders hindsight does not make"):
        RunDir(run.root).claim()


def test_links_are_refused_and_never_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".keep.tmp-4242").write_text("not the run's")
    run = RunDir(tmp_path / "run").claim()
    run.record("rl")
    (run.root / "rl").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="a run's folder is a link"):
        RunDir(run.root).claim()
    assert (elsewhere / ".keep.tmp-4242").exists()
    other = RunDir(tmp_path / "other").claim()
    other.record("sft")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / ".hindsight-run").symlink_to(other.mark)
    with pytest.raises(ConfigError, match="it is a link"):
        RunDir(linked).claim()


def test_a_run_inside_another_run_is_refused_and_the_sweep_does_not_enter_one(tmp_path):
    outer = RunDir(tmp_path / "outer").claim()
    rl = outer.record("rl")
    rl.mkdir()
    with pytest.raises(ConfigError, match="inside the run directory .*outer of another run"):
        RunDir(rl / "inner").claim()
    inner = rl / "inner"  # one made by an older hindsight before this check: its writer may be alive
    inner.mkdir()
    (inner / ".hindsight-run").write_text("{}")
    (inner / ".manifest.json.tmp-999999").write_text("a live writer's")
    (rl / ".x.tmp-999998").write_text("half")
    assert [p.name for p in outer.sweep_temporaries()] == [".x.tmp-999998"]
    assert (inner / ".manifest.json.tmp-999999").exists()
