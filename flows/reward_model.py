"""Reward-model stage: pairwise training on preference pairs from NAME-sft, register NAME-rm."""
from __future__ import annotations

import logging

from prefect import flow

from flows.common import run_declared, train
from hindsight.config import PipelineConfig
from hindsight.trainers.supervised import chance_warning
from hindsight.stage import StageContext, StageOutput, StageResult, StageSpec, model_uri

log = logging.getLogger("hindsight")


def reward_model_story(ctx: StageContext) -> StageOutput:
    cfg, r = ctx.cfg, ctx.cfg.reward_model
    out_dir = cfg.root / "reward_model" / "model"
    metrics = train(ctx, "reward-model", model_path=ctx.inputs["reward_model.base"], data=cfg.data.reading("prefs"),
                    out_dir=out_dir, lr=r.lr, epochs=r.epochs, batch_size=r.batch_size, max_length=r.max_length, seed=cfg.seed,
                    max_steps=r.max_steps, gradient_checkpointing=cfg.model.gradient_checkpointing,
                    eval_fraction=r.eval_fraction)
    ctx.log(metrics, 0)
    warning = chance_warning(metrics)
    if warning:
        log.warning(warning)
    return StageOutput(model_dir=out_dir, eval_accuracy=metrics.get("eval/pairwise_accuracy"))


REWARD_MODEL = StageSpec(
    name="reward-model", sections=("reward_model", "data", "seed", "name"),
    models=lambda cfg: {"reward_model.base": cfg.reward_model.base or model_uri(cfg, "sft")},
    data=("prefs",), registers="rm", story=reward_model_story)


@flow(name="reward-model", log_prints=False)
def reward_model_flow(cfg: PipelineConfig, force: bool = False, parent_run_id: str | None = None) -> StageResult:
    return run_declared(REWARD_MODEL, cfg, force, parent_run_id)
