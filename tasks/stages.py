"""The one stage task every stage runs in: its MLflow run, its story, registration, its result.

Cached (the key comes from the stage's declaration, see `hindsight.stage.cache_key`) and
retried by `flows.common.run_declared`.
"""
from __future__ import annotations

import logging
import time

from prefect import task
from prefect.runtime import task_run

from hindsight.config import PipelineConfig
from hindsight.cpus import set_stage_threads
from hindsight.faults import crash_point
from hindsight.stage import StageContext, StageResult, StageSpec, model_name
import tracking
from tasks.cache import cache_key_from_inputs

log = logging.getLogger("hindsight")


@task(name="stage", cache_key_fn=cache_key_from_inputs, persist_result=True)
def stage_task(spec: StageSpec, cfg: PipelineConfig, inputs: dict, data_md5: str, cache_key: str,
               parent_run_id: str | None) -> StageResult:
    t0 = time.perf_counter()
    set_stage_threads(cfg.resources.threads)  # before any model: a pod's CPU limit, not the node's cores
    attempt = task_run.run_count or 1  # each attempt is its own MLflow run
    name = model_name(cfg, spec.registers)  # tagged on the run: the one model a replayed spool may register for it
    with tracking.stage_run(cfg, spec.name, parent_run_id, attempt,
                            {"hindsight.cache_key": cache_key, "hindsight.model": name}) as run_id:
        tracking.log_context(cfg, run_id, data_md5)
        out = spec.story(StageContext(cfg=cfg, inputs=inputs, run_id=run_id,
                                      log=lambda metrics, step: tracking.log_metrics(cfg, run_id, metrics, step)))
        from hindsight.state.checkpoint import require_healthy  # torch: only a stage that trains needs it

        require_healthy(out.model_dir, spec.name, cfg.model.max_weight_abs)  # nor one that diverged to 1e30
        version = tracking.register(cfg, run_id, out.model_dir, name, tags=out.tags)
        if version != tracking.SPOOLED:
            tracking.name_registered(cfg, run_id, spec.name, name, version)
        try:
            crash_point("registered", 0)
            if out.then is not None and version != tracking.SPOOLED:  # `then` reads the registry
                look_back(cfg, run_id, spec.name, version, out.then)
            tracking.end_run(cfg, run_id)
        except BaseException:  # the run ends FAILED: `@latest` must not point at its version
            tracking.withdraw(cfg, name, version)
            raise
    return StageResult(stage=spec.name, model=name, version=version, run_id=run_id, eval_accuracy=out.eval_accuracy,
                       wall_s=time.perf_counter() - t0)


def look_back(cfg: PipelineConfig, run_id: str, stage: str, version: str, then) -> None:
    """The end-of-run look-back (the version comparison) reads what was trained: when it fails,
    the model is still good and stays registered; the failure is one error line and a tag."""
    try:
        then(run_id)
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}"
        log.error(f"{stage}: the end-of-run look-back failed ({message}); version {version} is registered, "
                  f"its comparison report is missing")
        tracking.set_tags(cfg, run_id, {"hindsight.lookback_error": message[:5000]})


def has_cached_result(key: str) -> bool:
    """Whether the stage task holds a result for `key` (a run now would return Cached): the
    checks that guard training are then skipped, as the stage trains nothing. Any doubt (a
    store that cannot be read) answers no, and the checks run."""
    from prefect.results import get_result_store

    try:
        return bool(get_result_store().update_for_task(stage_task, _sync=True).exists(key))
    except Exception:  # noqa: BLE001  (a storage error only costs the checks)
        return False
