"""Negative-sample stage: unlikelihood on the RL run's lowest-reward stored completions, register NAME-negft."""
from __future__ import annotations

from prefect import flow

from flows.common import run_declared
from hindsight.config import PipelineConfig
from hindsight.errors import DataError
from hindsight.stage import StageContext, StageOutput, StageResult, StageSpec, model_uri
from hindsight.state.rundir import RunDir
from hindsight.state.store import RolloutStore


def negative_ft_story(ctx: StageContext) -> StageOutput:
    # torch and transformers: imported when the stage trains, not when a cached rerun loads it
    from hindsight.learning.negative import negative_finetune, split_by_reward
    from hindsight.models.load import load_causal_lm, load_tokenizer
    from hindsight.scoring.evaluate import evaluate_model

    cfg, n = ctx.cfg, ctx.cfg.negative_ft
    negatives, positives = split_by_reward(RolloutStore(RunDir.of(cfg).rl.path), n.quantile)
    if not negatives:
        raise DataError(f"{cfg.root / 'rl'}: no stored low-reward completions to learn from (run the rl stage first)")
    model, tok = load_causal_lm(ctx.inputs["negative_ft.init"], cfg.model.dtype), load_tokenizer(ctx.inputs["negative_ft.init"])
    before = evaluate_model(cfg, model, tok)
    metrics = negative_finetune(model, tok.pad_token_id, negatives, positives, n.lr, n.steps, n.batch_size,
                                n.positive_weight, cfg.seed, log=ctx.log)
    metrics.update({"eval/accuracy_before": before, "eval/accuracy": evaluate_model(cfg, model, tok)})
    ctx.log(metrics, n.steps)
    out_dir = cfg.root / "negative_ft" / "model"
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    return StageOutput(model_dir=out_dir, eval_accuracy=metrics["eval/accuracy"])


NEGATIVE_FT = StageSpec(
    name="negative-ft", sections=("negative_ft", "model", "data", "eval", "seed", "name", "run_dir"),
    models=lambda cfg: {"negative_ft.init": cfg.negative_ft.init or model_uri(cfg, "policy")},
    data=("eval",), rewards=lambda cfg: [cfg.eval.reward],
    state=lambda cfg: RolloutStore(RunDir.of(cfg).rl.path).steps("scores"),
    registers="negft", story=negative_ft_story)


@flow(name="negative-ft", log_prints=False)
def negative_ft_flow(cfg: PipelineConfig, force: bool = False, parent_run_id: str | None = None) -> StageResult:
    return run_declared(NEGATIVE_FT, cfg, force, parent_run_id)
