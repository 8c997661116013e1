"""Reward-model stage: pairwise training on preference pairs, register X-rm."""
from __future__ import annotations

from prefect import flow

from flows.common import ensure_data, run_stage, sft_uri
from hindsight.config import PipelineConfig
from hindsight.preflight import check_inputs
from tasks import tracking
from tasks.cache import stage_key
from tasks.stages import reward_model_task
from tasks.tracking import resolve_model


@flow(name="reward-model", log_prints=True)
def reward_model_flow(cfg: PipelineConfig, force: bool = False, parent_run_id: str | None = None) -> dict:
    data_md5 = ensure_data(cfg)
    check_inputs(cfg, ["reward-model"])
    base_path, base_version = resolve_model(cfg, cfg.reward_model.base or sft_uri(cfg), "reward_model.base")
    key = stage_key("reward-model", {"rm": cfg.reward_model.model_dump(), "seed": cfg.seed,
                                     "data": cfg.data.model_dump(), "name": cfg.name},
                    {"base": base_version, "data_md5": data_md5}, tracking.store_id(cfg))
    return run_stage("reward-model", reward_model_task, cfg, force)(cfg, base_path, data_md5, key, parent_run_id)
