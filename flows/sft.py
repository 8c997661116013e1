"""SFT stage: fine-tune the base model on demonstrations, evaluate, register X-sft."""
from __future__ import annotations

from prefect import flow

from flows.common import ensure_data, run_stage
from hindsight.config import PipelineConfig
from hindsight.preflight import check_inputs
from tasks import tracking
from tasks.cache import stage_key
from tasks.stages import sft_task
from tasks.tracking import resolve_model


@flow(name="sft", log_prints=True)
def sft_flow(cfg: PipelineConfig, force: bool = False, parent_run_id: str | None = None) -> dict:
    data_md5 = ensure_data(cfg)
    check_inputs(cfg, ["sft"])
    key = stage_key("sft", {"sft": cfg.sft.model_dump(), "model": cfg.model.model_dump(), "seed": cfg.seed,
                            "data": cfg.data.model_dump(), "eval": cfg.eval.model_dump(), "name": cfg.name},
                    {"base": cfg.model.base, "data_md5": data_md5}, tracking.store_id(cfg))
    base_path, _ = resolve_model(cfg, cfg.model.base, "model.base")
    return run_stage("sft", sft_task, cfg, force)(cfg, base_path, data_md5, key, parent_run_id)
