"""The run directory as one object: every path of a run comes from here, so a file's name is
written once. `RunDir` is the whole run (runs/NAME: a folder per stage, the lock, the tracking
spool); `RLDir` is the RL stage's folder, whose layout is the look-back the project is named for:

    rl/config.json, fingerprint.json, decoding.json   what the run was started with
    rl/rollouts/, scores/, advantages/, parts/         the rollout store (`state.store`)
    rl/ledger/step-N.json                              where each group stands (`state.ledger`)
    rl/checkpoints/                                    versioned components (`state.checkpoint`)
    rl/metrics.jsonl, alerts.jsonl, resume-changes.jsonl, workers.jsonl
    rl/reports/, plots/, export/, judge/, rescored/, corrupt/
    rl/scale.json, scale-result.json, sampler.log

`RunContext` is what a reward or a tool may know of the run it scores for (where to cache),
handed to it as an argument.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


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

    def context(self) -> "RunContext":
        return RunContext(run_dir=str(self.path), cache_dir=str(self.path))


class RunDir:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    @classmethod
    def of(cls, cfg) -> "RunDir":
        return cls(cfg.root)

    def stage(self, workdir: str) -> Path:
        """A stage's own folder (`StageSpec.workdir`: sft, reward_model, rl, negative_ft)."""
        return self.root / workdir

    @property
    def rl(self) -> RLDir:
        return RLDir(self.root / "rl")

    spool = property(lambda self: self.root / "mlflow-spool")


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
