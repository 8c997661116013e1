"""The run directory as one object: every path of a run comes from here, so a file's name is
written once. `RunDir` is the whole run (runs/NAME: a folder per stage, the lock, the tracking
spool); `RLDir` is the RL stage's folder, whose layout is the look-back the project is named for:

    rl/config.json, fingerprint.json, decoding.json   what the run was started with
    rl/rollouts/, scores/, advantages/, parts/         the rollout store (`state.store`)
    rl/ledger/step-N.json                              where each group stands (`state.ledger`)
    rl/checkpoints/                                    versioned components (`state.checkpoint`)
    rl/metrics.jsonl, alerts.jsonl, resume-changes.jsonl, workers.jsonl
    rl/evals/                                          evaluation's greedy answers, per eval
    rl/reports/, plots/, export/, judge/, rescored/, corrupt/
    rl/scale.json, scale-result.json, sampler.log

`RunContext` is what a reward or a tool may know of the run it scores for (where to cache),
handed to it as an argument.

A run directory is hindsight's alone (`RunDir.claim`): hindsight makes it and marks it
(`.hindsight-run`, which also lists the top-level folders it made); an existing folder that is
not empty and not marked is refused, and so are `/`, system folders, the home folder, the
working directory and the folders above it. What cleans up (the sweep of a killed run's
temporaries) or moves things aside (`--force`) touches only the folders the mark lists.

The mark proves itself before anything trusts it (`read_mark`): a regular file (not a link),
a checksum of its own content, and folder names only from the set hindsight makes. A mark that
fails is one error line, not trust; a run directory inside another's is refused; the sweep
never follows a link and never enters a folder that holds another run's mark.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from hindsight.errors import ConfigError
from hindsight.fsutil import TEMPORARY, atomic_write_json, read_json

log = logging.getLogger("hindsight")
MARK = ".hindsight-run"
# the top-level names hindsight makes in a run directory; a folder holding only these (and
# their `.old-TIME` archives) is a run directory of an older hindsight, adopted and marked
MADE = ("sft", "reward_model", "rl", "negative_ft", "mlflow-spool")
# the files a sweep writes into a trial's run directory before the trial's own process claims it
TRIAL_FILES = ("trial.yaml", "trial.log", "trial-result.json")
OPEN_RUNS = "mlflow-open-runs.json"  # the MLflow runs started here and not yet ended (`tracking.runs`)
SYSTEM_FOLDERS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr",
                  "/var")
_OURS = re.compile(rf"^({'|'.join(re.escape(n) for n in MADE)})(\.old-[0-9-]+)?$|^\.hindsight\.lock$|^{re.escape(MARK)}$"
                   rf"|^({'|'.join(re.escape(n) for n in (*TRIAL_FILES, OPEN_RUNS))})$")


class RLDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    def find(cls, path: str | Path) -> "RLDir":
        """The RL folder of a run directory (runs/NAME), or the folder itself when it is one."""
        path = Path(path)
        return cls(path / "rl") if (path / "rl").is_dir() else cls(path)

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    # what the run was started with
    config = property(lambda self: self.path / "config.json")
    fingerprint = property(lambda self: self.path / "fingerprint.json")
    decoding = property(lambda self: self.path / "decoding.json")
    # its state
    checkpoints = property(lambda self: self.path / "checkpoints")
    ledger = property(lambda self: self.path / "ledger")
    scores = property(lambda self: self.path / "scores")
    score_parts = property(lambda self: self.path / "parts" / "scores")
    rescored = property(lambda self: self.path / "rescored")
    # what it logs
    metrics = property(lambda self: self.path / "metrics.jsonl")
    alerts = property(lambda self: self.path / "alerts.jsonl")
    resume_changes = property(lambda self: self.path / "resume-changes.jsonl")
    workers_log = property(lambda self: self.path / "workers.jsonl")
    sampler_log = property(lambda self: self.path / "sampler.log")
    stalls = property(lambda self: self.path / "stalls")  # why a role was replaced, with its stacks
    run_ids = property(lambda self: self.path / "mlflow_run_ids")
    # what it writes for people
    reports = property(lambda self: self.path / "reports")
    plots = property(lambda self: self.path / "plots")
    versions_report = property(lambda self: self.path / "reports" / "versions.html")
    export_policy = property(lambda self: self.path / "export" / "policy")
    judge_cache = property(lambda self: self.path / "judge")
    # `hindsight scale` talks to a running stage through these
    scale_request = property(lambda self: self.path / "scale.json")
    scale_result = property(lambda self: self.path / "scale-result.json")

    def report(self, step: int) -> Path:
        return self.reports / f"step-{step:06d}.html"

    def eval_answers(self, step: int) -> Path:
        """Evaluation's greedy answers after `step` steps (0: before training)."""
        return self.path / "evals" / f"step-{step:06d}.json"

    def context(self) -> "RunContext":
        return RunContext(run_dir=str(self.path), cache_dir=str(self.path))


def signed(mark: dict) -> dict:
    """The mark with the checksum of its other fields (`sha256`)."""
    body = {k: v for k, v in mark.items() if k != "sha256"}
    return {**body, "sha256": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()}


class UnsignedMark(ConfigError):
    """A mark with no checksum (an older hindsight's, or a hand-written one)."""


def read_mark(path: Path) -> dict | None:
    """The run directory's mark once it proves itself; None where there is none. A mark that is a
    link, is not one hindsight wrote (its checksum), or names a folder hindsight does not make is
    a ConfigError naming it: nothing is swept, moved or written on its word."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    why = None
    if not stat.S_ISREG(st.st_mode):
        why = "it is a link or not a regular file"
    else:
        try:
            mark = read_json(path, default=None)
        except Exception:  # not JSON at all: no mark of hindsight's either
            mark = None
        if not isinstance(mark, dict) or "sha256" not in mark:
            raise UnsignedMark(f"{path}: a mark with no checksum of hindsight's")
        if signed(mark)["sha256"] != mark["sha256"]:
            why = "its checksum does not match its content (edited by hand?)"
        elif not isinstance(mark.get("made"), list) or any(n not in MADE for n in mark["made"]):
            why = f"it names folders hindsight does not make (only {', '.join(MADE)})"
        else:
            return mark
    raise ConfigError(f"{path}: not a run-directory mark hindsight wrote: {why}; remove it, or give the run a "
                      f"folder of its own")


def enclosing_run(path: Path) -> Path | None:
    """A folder above `path` that is another run's directory (holds a mark), or None."""
    real = Path(os.path.realpath(path))
    return next((p for p in real.parents if os.path.lexists(p / MARK)), None)


class RunDir:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    @classmethod
    def of(cls, cfg) -> "RunDir":
        return cls(cfg.root)

    def stage(self, workdir: str) -> Path:
        """A stage's own folder (`StageSpec.workdir`: sft, reward_model, rl, negative_ft)."""
        return self.root / workdir

    # --- the run directory is hindsight's alone -------------------------------------------
    @property
    def mark(self) -> Path:
        return self.root / MARK

    def claim(self) -> "RunDir":
        """Make the run directory, or take one hindsight made; refuse any other folder."""
        refuse_reserved(self.root)
        outer = enclosing_run(self.root)
        if outer is not None:
            raise ConfigError(f"{self.root}: inside the run directory {outer} of another run; a run's folder is its "
                              f"own (default runs/NAME)")
        try:
            if self._proven():
                return self
        except UnsignedMark:  # an older hindsight's (or a hand-written) mark: adopted below only where the
            pass              # folder holds nothing hindsight does not make, as an unmarked one would be
        entries = sorted(p.name for p in self.root.iterdir()) if self.root.is_dir() else []
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError(f"{self.root}: the run directory is a file; choose a folder of the run's own")
        strangers = [n for n in entries if not _OURS.match(n)]
        if strangers:
            raise ConfigError(f"{self.root}: not a hindsight run directory: it holds files hindsight did not make "
                              f"({', '.join(strangers[:5])}{', ...' if len(strangers) > 5 else ''}) and no "
                              f"{MARK} mark; give the run a folder of its own (default runs/NAME)")
        made = sorted(n for n in entries if n in MADE)
        self.root.mkdir(parents=True, exist_ok=True)
        if made:  # the mark is written with hindsight's first folder (`record`): a refused run leaves none
            self._write_mark(made)
            log.info("run dir %s: made by an older hindsight (%s); marked as hindsight's", self.root, ", ".join(made))
        return self

    def _proven(self) -> bool:
        """Whether the folder holds a mark that proves itself, whose folders are not links."""
        mark = read_mark(self.mark)
        if mark is None:
            return False
        linked = [n for n in mark["made"] if (self.root / n).is_symlink()]
        if linked:
            raise ConfigError(f"{self.root / linked[0]}: a run's folder is a link; hindsight writes, sweeps and moves "
                              f"only real folders of its run directory")
        return True

    def _write_mark(self, made: list[str]) -> None:
        try:
            mark = read_mark(self.mark) or {"by": "hindsight", "created": time.time()}
        except UnsignedMark:
            mark = {"by": "hindsight", "created": time.time()}
        atomic_write_json(self.mark, signed({**mark, "made": sorted(made)}))

    def made(self) -> list[str]:
        """The top-level folders hindsight made here (recorded in the mark)."""
        mark = read_mark(self.mark)
        return list(mark["made"]) if mark else []

    def record(self, name: str) -> Path:
        """Note that hindsight makes the top-level folder `name` (before it writes there); the
        first one writes the mark. Called under the run lock, after `claim`."""
        if name not in MADE:
            raise ValueError(f"{name}: not a folder hindsight makes in a run directory")
        made = self.made()
        if name not in made or not self.mark.is_file():
            self.root.mkdir(parents=True, exist_ok=True)
            self._write_mark(sorted({*made, name}))
        return self.root / name

    def sweep_temporaries(self) -> list[Path]:
        """Remove what a killed process left half-written (`.NAME.tmp-PID` of the atomic writes),
        in the folders hindsight made and at their level, nowhere else. Called under the run lock:
        no other writer can be live."""
        removed = []
        try:
            if not self._proven():
                return removed
        except ConfigError:  # a mark that does not prove itself: nothing is swept on its word
            return removed
        for name in os.listdir(self.root):
            m = TEMPORARY.match(name)
            if m and int(m.group(1)) != os.getpid() and _OURS.match(name[1:name.rindex(".tmp-")]):
                removed.append(_remove(self.root / name))
        for name in self.made():
            if (self.root / name).is_dir() and not (self.root / name).is_symlink():
                removed += _sweep(self.root / name)
        return removed

    def move_aside(self, name: str) -> Path | None:
        """--force: move a folder hindsight made aside (never delete it); refuse one it did not make."""
        folder = self.root / name
        if not folder.exists():
            return None
        if name not in self.made():
            raise ConfigError(f"{folder}: hindsight did not make this folder ({self.mark} does not list it), so "
                              f"--force will not move it; move it yourself, or use another run_dir")
        stamp, n = time.strftime("%Y%m%d-%H%M%S"), 0
        while (target := folder.with_name(f"{folder.name}.old-{stamp}" + (f"-{n}" if n else ""))).exists():
            n += 1
        folder.rename(target)
        return target

    @property
    def rl(self) -> RLDir:
        return RLDir(self.root / "rl")

    spool = property(lambda self: self.root / "mlflow-spool")
    open_runs = property(lambda self: self.root / OPEN_RUNS)
    # a sweep trial's own files (TRIAL_FILES)
    trial_config = property(lambda self: self.root / "trial.yaml")
    trial_log = property(lambda self: self.root / "trial.log")
    trial_result = property(lambda self: self.root / "trial-result.json")


def system_folder_problem(path: Path) -> str | None:
    """Why `path` cannot be a run directory because it is `/` or a system folder (through any
    symlink), or None."""
    real = Path(os.path.realpath(path))
    if real == Path("/") or any(real == Path(f) or Path(f) in real.parents for f in SYSTEM_FOLDERS):
        shown = f"{path} (which resolves to {real})" if str(real) != str(path) else str(path)
        return (f"{shown} is / or a system folder: a run directory holds the run's files, choose one of its own "
                f"(default runs/NAME)")
    return None


def refuse_reserved(path: Path) -> None:
    """A run writes and moves things under its folder: never `/`, a system folder, the home
    folder, the working directory or a folder above it, also not through a symlink."""
    problem = system_folder_problem(path)
    if problem:
        raise ConfigError(problem)
    real = Path(os.path.realpath(path))
    cwd, home = Path(os.path.realpath(os.getcwd())), Path(os.path.realpath(Path.home()))
    shown = f"{path} (which resolves to {real})" if str(real) != str(path) else str(path)
    if real == home:
        raise ConfigError(f"{shown} is the home folder: a run directory holds the run's files, choose one of its "
                          f"own (default runs/NAME)")
    if real == cwd or real in cwd.parents:
        raise ConfigError(f"{shown} is the working directory or a folder above it: choose a folder of the run's "
                          f"own (default runs/NAME)")


def _remove(path: Path) -> Path:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)  # a link itself, never what it points to
    return path


def _sweep(root: Path) -> list[Path]:
    """The temporaries under `root`: links are not followed (os.walk's default) nor removed
    through, and a folder holding another run's mark is not entered."""
    removed = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in [*dirnames, *filenames]:
            m = TEMPORARY.match(name)
            if m and int(m.group(1)) != os.getpid():
                removed.append(_remove(here / name))
        dirnames[:] = [d for d in dirnames if not TEMPORARY.match(d) and not (here / d).is_symlink()
                       and not os.path.lexists(here / d / MARK)]
    return removed


@dataclass(frozen=True)
class RunContext:
    """What a reward function or a tool may know of the run: its RL folder, and the folder under
    which it may keep what it caches (the judge's verdicts go to `cache_dir`/judge). Plain
    strings: it crosses into the guarded reward process."""
    run_dir: str
    cache_dir: str

    def cache_for(self, name: str) -> str:
        """The folder a reward or tool named `name` keeps its cache in."""
        return str(Path(self.cache_dir) / name)


def step_file(step: int) -> str:
    """The name a step's files carry: numbered from 1, as the console, MLflow and the reports
    count steps, while the code's step index starts at 0 (index 0 is `step-000001`)."""
    return f"step-{step + 1:06d}"


def step_of(name: str) -> int:
    """The step index of a `step-NNNNNN...` file name (`step_file`'s inverse)."""
    return int(name.split(".")[0].split("-")[1]) - 1
