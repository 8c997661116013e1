"""The whole chain, in the stage registry's order (SFT -> reward model -> RL -> negative-ft), one MLflow
parent run with a nested run per stage."""
from __future__ import annotations

import time
from dataclasses import replace

from prefect import flow

from flows import registry
from flows.common import ensure_data
from hindsight.config import PipelineConfig
from hindsight.stage import StageResult, preflight
import tracking


@flow(name="pipeline", log_prints=False)
def pipeline_flow(cfg: PipelineConfig, force: bool = False) -> list[StageResult]:
    stages = [(s.load_spec(), s.load_flow()) for s in registry.pipeline_stages(cfg)]  # the registry's order
    data_md5 = ensure_data(cfg)
    for spec, _ in stages:
        preflight(spec, cfg)  # a bad RL reward fails now, not after SFT has trained
    parent = tracking.start_run(cfg, "pipeline")
    tracking.log_context(cfg, parent, data_md5)
    summary = []
    try:
        for spec, stage_flow in stages:
            summary.append(_timed(stage_flow, cfg, force or _upstream_retrained(spec, cfg, summary), parent))
        for row in summary:
            if row.eval_accuracy is not None:
                tracking.log_metrics(cfg, parent, {f"{row.stage}/eval_accuracy": row.eval_accuracy}, 0)
    except BaseException:
        tracking.end_run(cfg, parent, "FAILED")
        raise
    tracking.end_run(cfg, parent)
    return summary


def _upstream_retrained(spec, cfg: PipelineConfig, done: list[StageResult]) -> bool:
    """RL samples from the SFT policy: when this pipeline has just trained a new SFT version,
    the stored RL state (sampled from the old one) is set aside and RL trains anew, rather
    than refusing to resume. A resume after a crash finds SFT cached, and resumes."""
    return spec.name == "rl" and cfg.rl.init is None and any(r.stage == "sft" and not r.cached for r in done)


def _timed(stage_flow, cfg: PipelineConfig, force: bool, parent: str) -> StageResult:
    """Run a stage; the summary shows this call's wall time (short on a cache hit)."""
    t0 = time.perf_counter()
    result = stage_flow(cfg, force=force, parent_run_id=parent)
    return replace(result, wall_s=time.perf_counter() - t0)
