"""SFT stage: fine-tune the base model on demonstrations, evaluate, register NAME-sft."""
from __future__ import annotations

from prefect import flow

from flows.common import run_declared, train
from hindsight.config import PipelineConfig
from hindsight.stage import StageContext, StageOutput, StageResult, StageSpec
import tracking


def sft_story(ctx: StageContext) -> StageOutput:
    cfg, s = ctx.cfg, ctx.cfg.sft
    out_dir = cfg.root / "sft" / "model"
    metrics = train(ctx, "sft", model_path=ctx.inputs["model.base"], data=cfg.data.reading("sft"), out_dir=out_dir, lr=s.lr,
                    epochs=s.epochs, batch_size=s.batch_size, max_length=s.max_length, seed=cfg.seed, lora=s.lora,
                    max_steps=s.max_steps, gradient_checkpointing=cfg.model.gradient_checkpointing)
    from hindsight.scoring.evaluate import evaluate_path  # torch and transformers: only when SFT trains

    metrics["eval/accuracy"], decoding = evaluate_path(cfg, str(out_dir))
    tracking.log_decoding(cfg, ctx.run_id, decoding)
    ctx.log(metrics, 0)
    return StageOutput(model_dir=out_dir, eval_accuracy=metrics["eval/accuracy"])


SFT = StageSpec(
    name="sft", sections=("sft", "model", "data", "eval", "seed", "name"),
    models=lambda cfg: {"model.base": cfg.model.base},
    data=("sft", "eval"), rewards=lambda cfg: [cfg.eval.reward],
    registers="sft", story=sft_story)


@flow(name="sft", log_prints=False)
def sft_flow(cfg: PipelineConfig, force: bool = False, parent_run_id: str | None = None) -> StageResult:
    return run_declared(SFT, cfg, force, parent_run_id)
