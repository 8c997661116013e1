"""The whole chain: SFT -> reward model -> RL (-> negative-ft), one MLflow parent run with a nested run per stage."""
from __future__ import annotations

import time

from prefect import flow

from flows.common import ensure_data
from flows.reward_model import reward_model_flow
from flows.negative_ft import negative_ft_flow
from flows.rl import rl_flow
from flows.sft import sft_flow
from hindsight.config import PipelineConfig
from hindsight.preflight import check_inputs
from tasks import tracking


@flow(name="pipeline", log_prints=True)
def pipeline_flow(cfg: PipelineConfig, force: bool = False) -> list[dict]:
    data_md5 = ensure_data(cfg)
    stages = [name for name, on in (("sft", cfg.sft.enabled), ("reward-model", cfg.reward_model.enabled), ("rl", True)) if on]
    check_inputs(cfg, stages)  # a bad RL reward fails now, not after SFT has trained
    parent = tracking.start_run(cfg, "pipeline")
    tracking.log_context(cfg, parent, data_md5)
    summary = []
    try:
        for enabled, stage in ((cfg.sft.enabled, sft_flow), (cfg.reward_model.enabled, reward_model_flow),
                               (True, rl_flow), (cfg.negative_ft.enabled, negative_ft_flow)):
            if enabled:
                summary.append(_timed(stage, cfg, force, parent))
        for row in summary:
            if row.get("eval/accuracy") is not None:
                tracking.log_metrics(cfg, parent, {f"{row['stage']}/eval_accuracy": row["eval/accuracy"]}, 0)
    except BaseException:
        tracking.end_run(cfg, parent, "FAILED")
        raise
    tracking.end_run(cfg, parent)
    return summary


def _timed(stage, cfg: PipelineConfig, force: bool, parent: str) -> dict:
    """Run a stage; a cache hit shows as a short wall time and `cached: True`."""
    t0 = time.perf_counter()
    result = dict(stage(cfg, force=force, parent_run_id=parent))
    elapsed = time.perf_counter() - t0
    result["cached"] = elapsed < 0.5 * result.get("wall_s", 0.0)
    result["wall_s"] = elapsed
    return result
