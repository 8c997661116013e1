"""Cached, retried stage tasks. Each opens its own nested MLflow run and registers its output."""
from __future__ import annotations

import time

from prefect import task

from hindsight.config import PipelineConfig
from hindsight.data import load_rows
from hindsight.evaluate import accuracy
from hindsight.models import load_causal_lm, load_tokenizer
from tasks import tracking
from tasks.cache import cache_key_from_inputs


def eval_rows(cfg: PipelineConfig) -> list[dict]:
    return load_rows(cfg.data.eval, required=("prompt",), split=cfg.data.eval_split,
                     columns=cfg.data.columns or None, limit=cfg.eval.limit)


def evaluate_model(cfg: PipelineConfig, model, tok) -> float:
    """Held-out accuracy with the config's eval settings; every stage reports it the same way."""
    acc, _ = accuracy(model.eval(), tok, eval_rows(cfg), cfg.eval.reward, cfg.eval.max_new_tokens)
    return acc


def _train(cfg: PipelineConfig, run_id: str, stage: str, kwargs: dict) -> dict:
    """A TRL trainer in this process, or under `accelerate launch` with resources.num_processes."""
    from hindsight.distributed import run_trainer  # TRL and peft take seconds to import; only these stages need them

    return run_trainer(stage, kwargs, cfg.resources.num_processes, cfg.resources.accelerate_config,
                       log=lambda m, step: tracking.log_metrics(cfg, run_id, m, step))


def evaluate_path(cfg: PipelineConfig, path: str) -> float:
    return evaluate_model(cfg, load_causal_lm(path, cfg.model.dtype), load_tokenizer(path))


@task(name="sft", cache_key_fn=cache_key_from_inputs, persist_result=True)
def sft_task(cfg: PipelineConfig, base: str, data_md5: str, cache_key: str, parent_run_id: str | None) -> dict:
    t0 = time.perf_counter()
    with tracking.stage_run(cfg, "sft", parent_run_id, {"hindsight.cache_key": cache_key}) as run_id:
        return _sft(cfg, base, data_md5, run_id, t0)


def _sft(cfg: PipelineConfig, base: str, data_md5: str, run_id: str, t0: float) -> dict:
    tracking.log_context(cfg, run_id, data_md5)
    out_dir = cfg.root / "sft" / "model"
    s = cfg.sft
    metrics = _train(cfg, run_id, "sft", dict(
        model_path=base, data_path=cfg.data.sft, out_dir=out_dir, lr=s.lr, epochs=s.epochs, batch_size=s.batch_size,
        max_length=s.max_length, seed=cfg.seed, lora=s.lora, max_steps=s.max_steps, columns=cfg.data.columns or None))
    metrics["eval/accuracy"] = evaluate_path(cfg, str(out_dir))
    tracking.log_metrics(cfg, run_id, metrics, 0)
    version = tracking.register(cfg, run_id, out_dir, f"{cfg.name}-sft")
    tracking.end_run(cfg, run_id)
    return {"stage": "sft", "model": f"{cfg.name}-sft", "version": version, "run_id": run_id,
            "eval/accuracy": metrics["eval/accuracy"], "wall_s": time.perf_counter() - t0}


@task(name="reward-model", cache_key_fn=cache_key_from_inputs, persist_result=True)
def reward_model_task(cfg: PipelineConfig, base_path: str, data_md5: str, cache_key: str,
                      parent_run_id: str | None) -> dict:
    t0 = time.perf_counter()
    with tracking.stage_run(cfg, "reward-model", parent_run_id, {"hindsight.cache_key": cache_key}) as run_id:
        return _reward_model(cfg, base_path, data_md5, run_id, t0)


def _reward_model(cfg: PipelineConfig, base_path: str, data_md5: str, run_id: str, t0: float) -> dict:
    tracking.log_context(cfg, run_id, data_md5)
    out_dir = cfg.root / "reward_model" / "model"
    r = cfg.reward_model
    metrics = _train(cfg, run_id, "reward-model", dict(
        model_path=base_path, data_path=cfg.data.prefs, out_dir=out_dir, lr=r.lr, epochs=r.epochs,
        batch_size=r.batch_size, max_length=r.max_length, seed=cfg.seed, max_steps=r.max_steps,
        columns=cfg.data.columns or None))
    tracking.log_metrics(cfg, run_id, metrics, 0)
    version = tracking.register(cfg, run_id, out_dir, f"{cfg.name}-rm")
    tracking.end_run(cfg, run_id)
    return {"stage": "reward-model", "model": f"{cfg.name}-rm", "version": version, "run_id": run_id,
            "eval/accuracy": None, "wall_s": time.perf_counter() - t0}


@task(name="negative-ft", cache_key_fn=cache_key_from_inputs, persist_result=True)
def negative_ft_task(cfg: PipelineConfig, init_path: str, data_md5: str, cache_key: str,
                     parent_run_id: str | None) -> dict:
    t0 = time.perf_counter()
    with tracking.stage_run(cfg, "negative-ft", parent_run_id, {"hindsight.cache_key": cache_key}) as run_id:
        return _negative_ft(cfg, init_path, data_md5, run_id, t0)


def _negative_ft(cfg: PipelineConfig, init_path: str, data_md5: str, run_id: str, t0: float) -> dict:
    from hindsight.errors import DataError
    from hindsight.negative import negative_finetune, split_by_reward
    from hindsight.store import RolloutStore

    tracking.log_context(cfg, run_id, data_md5)
    n = cfg.negative_ft
    negatives, positives = split_by_reward(RolloutStore(cfg.root / "rl"), n.quantile)
    if not negatives:
        raise DataError(f"{cfg.root / 'rl'}: no stored low-reward completions to learn from (run the rl stage first)")
    model, tok = load_causal_lm(init_path, cfg.model.dtype), load_tokenizer(init_path)
    before = evaluate_model(cfg, model, tok)
    metrics = negative_finetune(model, tok.pad_token_id, negatives, positives, n.lr, n.steps, n.batch_size,
                                n.positive_weight, cfg.seed, log=lambda m, s: tracking.log_metrics(cfg, run_id, m, s))
    metrics.update({"eval/accuracy_before": before, "eval/accuracy": evaluate_model(cfg, model, tok)})
    tracking.log_metrics(cfg, run_id, metrics, n.steps)
    out_dir = cfg.root / "negative_ft" / "model"
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    version = tracking.register(cfg, run_id, out_dir, f"{cfg.name}-negft")
    tracking.end_run(cfg, run_id)
    return {"stage": "negative-ft", "model": f"{cfg.name}-negft", "version": version, "run_id": run_id,
            "eval/accuracy": metrics["eval/accuracy"], "wall_s": time.perf_counter() - t0}
