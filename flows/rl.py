"""RL stage: rollout -> score -> update, repeated; rollouts persisted between the steps.

The stage task is cached like the others, and retried: a retry reopens the run directory
and resumes from its newest checkpoint, training on stored rollouts before sampling anew.
"""
from __future__ import annotations

import time

from prefect import flow, task

from flows.common import ensure_data, rm_uri, run_stage, sft_uri
from hindsight.config import PipelineConfig
from hindsight.preflight import check_inputs
from tasks import tracking
from tasks.cache import cache_key_from_inputs, stage_key
from tasks.rl import close_run, evaluate_task, get_run, open_run, rollout_task, score_task, update_task
from tasks.tracking import resolve_model


@flow(name="rl", log_prints=True)
def rl_flow(cfg: PipelineConfig, force: bool = False, parent_run_id: str | None = None) -> dict:
    data_md5 = ensure_data(cfg)
    check_inputs(cfg, ["rl"])
    init_path, init_version = resolve_model(cfg, cfg.rl.init or sft_uri(cfg), "rl.init")
    needs_rm = cfg.rl.reward_model_weight > 0 or (cfg.rl.algorithm == "ppo" and cfg.rl.ppo.critic_init == "reward_model")
    rm_path, rm_version = resolve_model(cfg, rm_uri(cfg), "rl (the reward model, NAME-rm)") if needs_rm else (None, None)
    key = stage_key("rl", {"rl": cfg.rl.model_dump(), "model": cfg.model.model_dump(), "seed": cfg.seed,
                           "data": cfg.data.model_dump(), "eval": cfg.eval.model_dump(), "name": cfg.name,
                           "run_dir": str(cfg.root)},
                    {"init": init_version, "rm": rm_version, "data_md5": data_md5})
    return run_stage("rl", rl_task, cfg, force)(cfg, init_path, rm_path, data_md5, key, parent_run_id)


@task(name="rl-stage", cache_key_fn=cache_key_from_inputs, persist_result=True)
def rl_task(cfg: PipelineConfig, init_path: str, rm_path: str | None, data_md5: str, cache_key: str,
            parent_run_id: str | None) -> dict:
    t0 = time.perf_counter()
    with tracking.stage_run(cfg, "rl", parent_run_id, {"hindsight.cache_key": cache_key}) as run_id:
        tracking.log_context(cfg, run_id, data_md5)
        key = open_run(cfg, init_path, rm_path)
        try:
            return _train(cfg, key, run_id, t0)
        finally:
            close_run(key)


def _train(cfg: PipelineConfig, key: str, run_id: str, t0: float) -> dict:
    """The stage's story: evaluate, then rollout -> score -> update per step, evaluate, register."""
    run = get_run(key)
    log = lambda m, step: tracking.log_metrics(cfg, run_id, m, step)  # noqa: E731
    if run.start_step:
        tracking.set_tags(cfg, run_id, {"hindsight.resumed_from_step": run.start_step})
    log({"eval/accuracy": evaluate_task(key)}, run.start_step)
    for step in range(run.start_step, cfg.rl.steps):
        rollout = rollout_task(key, step)
        metrics = {**_numeric(rollout), **_numeric(score_task(key, step)), **update_task(key, step)}
        log(metrics, step + 1)
        if rollout.get("replay/ids"):
            tracking.log_json(cfg, run_id, {"step": step, "ids": rollout["replay/ids"]}, f"replay/step-{step:06d}.json")
        print(f"rl step {step + 1}/{cfg.rl.steps} reward {metrics['reward/mean']:.3f} kl {metrics.get('kl', 0.0):.4f}")
        if (step + 1) % cfg.rl.eval_every == 0 and step + 1 < cfg.rl.steps:
            log({"eval/accuracy": evaluate_task(key)}, step + 1)
    final_acc = evaluate_task(key)
    log({"eval/accuracy": final_acc}, cfg.rl.steps)
    final_dir = run.ckpt.policy_dir(cfg.rl.steps)
    version = tracking.register(cfg, run_id, final_dir, f"{cfg.name}-policy")
    tracking.end_run(cfg, run_id)
    return {"stage": "rl", "model": f"{cfg.name}-policy", "version": version, "run_id": run_id,
            "eval/accuracy": final_acc, "wall_s": time.perf_counter() - t0}


def _numeric(d: dict) -> dict:
    return {k: v for k, v in d.items() if isinstance(v, (int, float))}
