"""RL step tasks. Models stay resident in this process (keyed by run), tasks pass step numbers."""
from __future__ import annotations

from collections.abc import Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from hindsight.config import PipelineConfig
from hindsight.lookback.rebuild import write_plots, write_step_report
from hindsight.coordination.run import RLRun
from hindsight.fsutil import atomic_write_json
from hindsight.scoring.evaluate import evaluate_answers

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


@task(name="steps", task_run_name="steps-{first}-{last}", cache_policy=NO_CACHE)
def steps_task(key: str, first: int, last: int, after_step: Callable[[int, dict], None]) -> None:
    """Steps `first`..`last - 1` (a checkpoint interval), each rollout -> score -> update and then
    `after_step(step, metrics)`, the flow's logging, alerts and evaluation. One Prefect task for
    the interval, not one per step: on this CPU a task per step cost ~10% of a step
    (bench/step_task_cost.py). A retry continues at the first step not yet done and redoes only
    what did not land; a failure once a step's update has begun, or in what follows it, is not
    retried in place (`RLRun.updating`): the stage's retry resumes from the checkpoint."""
    run = get_run(key)
    for step in range(max(first, run.next_step), last):
        _, rollout = run.rollout(step)
        _, score = run.score(step)
        metrics = {**rollout, **score, **run.update(step)}
        with run.recording(step):
            after_step(step, metrics)


@task(name="report")
def report_task(key: str, done: int) -> list[str]:
    """The step's HTML rollout report and the run's plots, written under the run directory."""
    run = get_run(key)
    report = write_step_report(run.dir, done, run.tok, run.cfg.name, run.rl.report_groups)
    return [str(report), *map(str, write_plots(run.dir, done))]


@task(name="evaluate")
def evaluate_task(key: str, step: int) -> tuple[float, list[dict]]:
    """Held-out accuracy after `step` steps, and each greedy answer, kept under rl/evals/ (what
    `hindsight compare --eval` lines up across runs)."""
    run = get_run(key)
    acc, answers = evaluate_answers(run.cfg, run.policy, run.tok, run.pool.reward_worker)
    atomic_write_json(run.paths.eval_answers(step), {"step": step, "accuracy": acc, "answers": answers})
    return acc, answers
