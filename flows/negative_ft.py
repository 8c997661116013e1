"""Negative-sample stage: unlikelihood on the RL run's lowest-reward stored completions, register X-negft."""
from __future__ import annotations

from prefect import flow

from flows.common import ensure_data, run_stage
from hindsight.config import PipelineConfig
from hindsight.store import RolloutStore
from tasks import tracking
from tasks.cache import stage_key
from tasks.stages import negative_ft_task
from tasks.tracking import resolve_model


@flow(name="negative-ft", log_prints=True)
def negative_ft_flow(cfg: PipelineConfig, force: bool = False, parent_run_id: str | None = None) -> dict:
    data_md5 = ensure_data(cfg)
    init_path, init_version = resolve_model(cfg, cfg.negative_ft.init or f"models:/{cfg.name}-policy@latest",
                                            "negative_ft.init")
    store = RolloutStore(cfg.root / "rl")
    key = stage_key("negative-ft", {"negative_ft": cfg.negative_ft.model_dump(), "seed": cfg.seed,
                                    "eval": cfg.eval.model_dump(), "name": cfg.name, "run_dir": str(cfg.root)},
                    {"init": init_version, "data_md5": data_md5, "shards": store.steps("scores")}, tracking.store_id(cfg))
    return run_stage("negative-ft", negative_ft_task, cfg, force)(cfg, init_path, data_md5, key, parent_run_id)
