"""RL step tasks. Models stay resident in this process (keyed by run), tasks pass step numbers."""
from __future__ import annotations

from prefect import task

from hindsight.config import PipelineConfig
from hindsight.lookback import write_plots, write_step_report
from hindsight.rl import RLRun
from tasks.stages import evaluate_model

_RESIDENT: dict[str, RLRun] = {}


def open_run(cfg: PipelineConfig, init_path: str, rm_path: str | None) -> str:
    """Load the run's models from its newest checkpoint; returns the key the step tasks use.

    Always a fresh load: after a failed attempt the in-memory policy may be ahead of the
    newest checkpoint, and a retry must resume from what is on disk.
    """
    key = str(cfg.root.resolve())
    _RESIDENT[key] = RLRun(cfg, init_path, rm_path)
    return key


def close_run(key: str) -> None:
    run = _RESIDENT.pop(key, None)
    if run is not None:
        run.close()


def get_run(key: str) -> RLRun:
    return _RESIDENT[key]


@task(name="step")
def step_task(key: str, step: int) -> dict:
    """One RL step, rollout -> score -> update, as one Prefect task (one round trip, not three).
    A retry redoes only what did not land; `RLRun.updating` tells a failure inside the update,
    which is not retried in place (see flows/rl.py)."""
    run = get_run(key)
    _, rollout = run.rollout(step)
    _, score = run.score(step)
    return {**rollout, **score, **run.update(step)}


@task(name="report")
def report_task(key: str, done: int) -> list[str]:
    """The step's HTML rollout report and the run's plots, written under the run directory."""
    run = get_run(key)
    report = write_step_report(run.dir, done, run.tok, run.cfg.name, run.rl.report_groups)
    return [str(report), *map(str, write_plots(run.dir, done))]


@task(name="evaluate")
def evaluate_task(key: str) -> float:
    run = get_run(key)
    return evaluate_model(run.cfg, run.policy, run.tok, run.reward_worker)
