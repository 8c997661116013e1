"""What every stage flow does: data at its pinned version, a preflight of what the stage
declares it reads, its input models from the registry, then the cached, retried stage task."""
from __future__ import annotations

import copy
import logging
from dataclasses import replace
from pathlib import Path

from hindsight.config import PipelineConfig
from hindsight.data.rows import dvc_dir_md5, pinned_md5
from hindsight.data.demo import demo_data
from hindsight.errors import DataError, HindsightError, StageError, TrackingError
from hindsight.console import say
from hindsight.state.rundir import RunDir
from hindsight.state.runlock import run_lock
from hindsight.stage import StageContext, StageResult, StageSpec, check_models, check_prompts, preflight
from tasks.cache import declared_key
from tasks.stages import has_cached_result, stage_task
from tracking.spool import Spool
import tracking
from tracking import SPOOLED, resolve_model

log = logging.getLogger("hindsight")


def run_declared(spec: StageSpec, cfg: PipelineConfig, force: bool, parent_run_id: str | None) -> StageResult:
    with run_lock(cfg.root):  # a deployed flow holds it too, not only the CLI
        left = RunDir.of(cfg).sweep_temporaries()  # a killed run's half-written files, and its runs left RUNNING
        ended = tracking.end_orphaned_runs(cfg)
        if left or ended:
            say(f"a killed run left {len(left)} temporary files (removed) and {len(ended)} MLflow runs RUNNING "
                f"(ended as KILLED)")
        data_md5 = ensure_data(cfg)
        preflight(spec, cfg)
        if force:  # retrain from the stage's inputs: its old state is kept, aside, never resumed from
            moved = RunDir.of(cfg).move_aside(spec.workdir)
            if moved:
                say(f"--force: moved the previous {spec.name} state to {moved}")
        paths, versions = {}, {}
        for role, uri in spec.models(cfg).items():
            paths[role], versions[role] = resolve_model(cfg, uri, role) if uri else (None, None)
        key = declared_key(spec, cfg, versions, data_md5)
        if force or not has_cached_result(key):  # a cached stage trains nothing: seconds saved on a rerun
            check_models(paths)
            check_prompts(spec, cfg, paths)  # with the input model at hand, still before any MLflow run
        RunDir.of(cfg).record(spec.workdir)  # before the stage writes there: --force and the sweep may touch it
        return run_stage(spec, cfg, force)(spec, cfg, paths, data_md5, key, parent_run_id)


def ensure_data(cfg: PipelineConfig) -> str:
    """Return the data version (DVC md5). Builds the demo data when the config reads it and it is missing.

    A fresh clone has no DVC remote to pull from; the demo data is regenerated
    deterministically and must reproduce the md5 pinned in data.dvc.
    """
    d = cfg.data
    data_dir = Path(d.dir)
    files, build = demo_data(d.demo)
    if d.build_demo and demo_files_read(d) and not all((data_dir / f).exists() for f in files):
        others = sorted(p.name for p in data_dir.iterdir() if p.name not in files) if data_dir.is_dir() else []
        if others:
            raise DataError(f"{data_dir}: the demo data is built only into a folder of its own, and this one holds "
                            f"other files ({', '.join(others[:5])}); point data.dir (and data.prompts, eval, sft, "
                            f"prefs) at your files with data.build_demo: false, or at an empty folder for the demo")
        log.info("building demo data in %s", data_dir)
        build(data_dir, seed=0)
    if d.dvc_file and Path(d.dvc_file).exists() and data_dir.is_dir():
        actual, pinned = dvc_dir_md5(data_dir), pinned_md5(d.dvc_file)
        if actual != pinned:
            raise DataError(f"{data_dir}: md5 {actual} does not match {pinned} pinned in {d.dvc_file} "
                            f"(run `dvc checkout`, or `hindsight data build` for the demo data)")
        return pinned
    return dvc_dir_md5(data_dir) if data_dir.is_dir() else "external"


def demo_files_read(d) -> bool:
    """Whether the config reads any demo file in data.dir: a config naming only its own files
    never gets the demo built beside them."""
    demo = {(Path(d.dir) / f).resolve() for f in demo_data(d.demo)[0]}
    return any(Path(getattr(d, name)).resolve() in demo for name in ("prompts", "eval", "sft", "prefs"))


def run_stage(spec: StageSpec, cfg: PipelineConfig, force: bool):
    """The stage task with the config's retry policy, and `force` as a cache refresh.

    Only unexpected failures are retried: a `HindsightError` is bad input, and would fail
    the same way again. Once retries are spent, the error names the stage and its cause.
    `cached` comes from Prefect's own state, not from timing.
    """
    task = stage_task.with_options(name=f"{spec.name}-stage", retries=cfg.retries.count, retry_delay_seconds=cfg.retries.delay_s,
                                   refresh_cache=force, retry_condition_fn=transient)

    def call(*args) -> StageResult:
        state = task(*args, return_state=True)
        try:
            result = state.result()
        except HindsightError as exc:
            named = copy.copy(exc)  # the same class and attributes (a preemption's signal), the stage named
            named.args = (f"stage {spec.name}: {exc}",)
            raise named from exc
        except Exception as exc:
            raise StageError(
                f"stage {spec.name} failed after {cfg.retries.count + 1} attempt(s): {type(exc).__name__}: {exc}. "
                f"Its state under {cfg.root} is kept; rerun the same command to resume (--debug for the traceback)"
            ) from exc
        return replace(_registered(result, cfg), cached=state.name == "Cached")

    return call


def _registered(result: StageResult, cfg: PipelineConfig) -> StageResult:
    """A stage whose registration waited in the spool (MLflow was down) goes on only once
    `hindsight sync` has registered it: the next stage must not load an older version."""
    if result.version != SPOOLED:
        return result
    spool = Spool(cfg.root)
    version = spool.registered_version(result.run_id)
    if version is None:
        raise TrackingError(f"stage {result.stage}: trained and saved under {cfg.root}, but the MLflow server was "
                            f"unreachable, so its registration and {len(spool.pending())} other tracking writes wait "
                            f"in {spool.ops}; once the server is back, run `hindsight sync {cfg.root}`, then rerun "
                            f"this command (the stage is cached)")
    return replace(result, version=version)


def transient(task, task_run, state) -> bool:
    """Retry only unexpected failures and stalled roles: bad input (a HindsightError) would fail
    the same way again."""
    exc = state.data if isinstance(state.data, BaseException) else state.result(raise_on_failure=False)
    return not isinstance(exc, HindsightError) or exc.transient


def train(ctx: StageContext, trainer: str, **kwargs) -> dict:
    """A TRL trainer in this process, or under `accelerate launch` with resources.num_processes."""
    from hindsight.trainers.launch import run_trainer  # TRL and peft take seconds to import; only these stages need them

    res = ctx.cfg.resources
    return run_trainer(trainer, kwargs, res.num_processes, res.accelerate_config, log=ctx.log)
