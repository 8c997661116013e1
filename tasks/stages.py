"""The one stage task every stage runs in: its MLflow run, its story, registration, its result.

Cached (the key comes from the stage's declaration, see `hindsight.stage.cache_key`) and
retried by `flows.common.run_declared`.
"""
from __future__ import annotations

import time

from prefect import task
from prefect.runtime import task_run

from hindsight.config import PipelineConfig
from hindsight.stage import StageContext, StageResult, StageSpec, model_name
import tracking
from tasks.cache import cache_key_from_inputs


@task(name="stage", cache_key_fn=cache_key_from_inputs, persist_result=True)
def stage_task(spec: StageSpec, cfg: PipelineConfig, inputs: dict, data_md5: str, cache_key: str,
               parent_run_id: str | None) -> StageResult:
    t0 = time.perf_counter()
    attempt = task_run.run_count or 1  # each attempt is its own MLflow run
    with tracking.stage_run(cfg, spec.name, parent_run_id, attempt, {"hindsight.cache_key": cache_key}) as run_id:
        tracking.log_context(cfg, run_id, data_md5)
        out = spec.story(StageContext(cfg=cfg, inputs=inputs, run_id=run_id,
                                      log=lambda metrics, step: tracking.log_metrics(cfg, run_id, metrics, step)))
        name = model_name(cfg, spec.registers)
        version = tracking.register(cfg, run_id, out.model_dir, name, tags=out.tags)
        if out.then is not None and version != tracking.SPOOLED:  # `then` reads the registry
            out.then(run_id)
        tracking.end_run(cfg, run_id)
    return StageResult(stage=spec.name, model=name, version=version, run_id=run_id, eval_accuracy=out.eval_accuracy,
                       wall_s=time.perf_counter() - t0)
