"""The one stage task every stage runs in: its MLflow run, its story, registration, its result.

Cached (the key comes from the stage's declaration, see `hindsight.stage.cache_key`) and
retried by `flows.common.run_declared`. The helpers below are what stories call for I/O.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from prefect import task

from hindsight.config import PipelineConfig
from hindsight.data.rows import load_rows
from hindsight.scoring.evaluate import accuracy
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.stage import StageContext, StageResult, StageSpec, model_name
from tasks import tracking
from tasks.cache import cache_key_from_inputs


@task(name="stage", cache_key_fn=cache_key_from_inputs, persist_result=True)
def stage_task(spec: StageSpec, cfg: PipelineConfig, inputs: dict, data_md5: str, cache_key: str,
               parent_run_id: str | None) -> StageResult:
    t0 = time.perf_counter()
    with tracking.stage_run(cfg, spec.name, parent_run_id, {"hindsight.cache_key": cache_key}) as run_id:
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


def eval_rows(cfg: PipelineConfig) -> list[dict]:
    return load_rows(cfg.data.eval, required=("prompt",), split=cfg.data.eval_split,
                     columns=cfg.data.columns or None, limit=cfg.eval.limit)


def evaluate_model(cfg: PipelineConfig, model, tok, worker=None) -> float:
    """Held-out accuracy with the config's eval settings; every stage reports it the same way.
    The judge runs guarded like any reward: in `worker`, or in a worker of its own when
    rl.reward_isolation is `process`."""
    with judge_worker(cfg, worker) as w:
        acc, _ = accuracy(model.eval(), tok, eval_rows(cfg), cfg.eval.reward, cfg.eval.max_new_tokens, w,
                          cfg.rl.reward_timeout_s, cfg.rl.reward_fallback)
    return acc


@contextmanager
def judge_worker(cfg: PipelineConfig, worker=None):
    """The given reward worker, or a fresh one for this evaluation (closed after), or None inline."""
    if worker is not None or cfg.rl.reward_isolation != "process":
        yield worker
        return
    from hindsight.scoring.guarded import RewardWorker

    own = RewardWorker()
    try:
        yield own
    finally:
        own.close()


def evaluate_path(cfg: PipelineConfig, path: str) -> float:
    return evaluate_model(cfg, load_causal_lm(path, cfg.model.dtype), load_tokenizer(path))


def train(ctx: StageContext, trainer: str, **kwargs) -> dict:
    """A TRL trainer in this process, or under `accelerate launch` with resources.num_processes."""
    from hindsight.learning.launch import run_trainer  # TRL and peft take seconds to import; only these stages need them

    res = ctx.cfg.resources
    return run_trainer(trainer, kwargs, res.num_processes, res.accelerate_config, log=ctx.log)
