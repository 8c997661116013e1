"""A test-only stage: its flow file, as a new stage's would be (the registry entry is the test's)."""
from __future__ import annotations

from prefect import flow

from flows.common import run_declared
from hindsight.config import PipelineConfig
from hindsight.stage import StageContext, StageOutput, StageResult, StageSpec


def echo_story(ctx: StageContext) -> StageOutput:
    out = ctx.cfg.root / "echo" / "model"
    out.mkdir(parents=True, exist_ok=True)
    return StageOutput(model_dir=out)


ECHO = StageSpec(name="echo", sections=("seed", "name"), models=lambda cfg: {}, registers="echo", story=echo_story)


@flow(name="echo", log_prints=False)
def echo_flow(cfg: PipelineConfig, force: bool = False, parent_run_id: str | None = None) -> StageResult:
    return run_declared(ECHO, cfg, force, parent_run_id)
