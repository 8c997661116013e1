"""RL stage: rollout -> score -> update, repeated; rollouts persisted between the steps.

The stage task is cached like the others, and retried: a retry reopens the run directory
and resumes from its newest checkpoint, training on stored rollouts before sampling anew.
"""
from __future__ import annotations

import time

from prefect import flow, task

from flows.common import ensure_data, rm_uri, run_stage, sft_uri
from hindsight.config import PipelineConfig
from hindsight.errors import AlertStop
from hindsight.progress import StepProgress
from hindsight.preflight import check_inputs
from tasks import tracking
from tasks.cache import cache_key_from_inputs, stage_key
from tasks.lookback import compare_versions
from tasks.rl import close_run, evaluate_task, get_run, open_run, report_task, rollout_task, score_task, update_task
from tasks.tracking import resolve_model


@flow(name="rl", log_prints=True)
def rl_flow(cfg: PipelineConfig, force: bool = False, parent_run_id: str | None = None) -> dict:
    data_md5 = ensure_data(cfg)
    check_inputs(cfg, ["rl"])
    init_path, init_version = resolve_model(cfg, cfg.rl.init or sft_uri(cfg), "rl.init")
    needs_rm = cfg.rl.needs_reward_model()
    rm_path, rm_version = resolve_model(cfg, rm_uri(cfg), "rl (the reward model, NAME-rm)") if needs_rm else (None, None)
    key = stage_key("rl", {"rl": cfg.rl.model_dump(), "model": cfg.model.model_dump(), "seed": cfg.seed,
                           "data": cfg.data.model_dump(), "eval": cfg.eval.model_dump(), "name": cfg.name,
                           "run_dir": str(cfg.root)},
                    {"init": init_version, "rm": rm_version, "data_md5": data_md5}, tracking.store_id(cfg))
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
    """The stage's story: evaluate, then rollout -> score -> update per step while watching
    the metrics (alerts, reports, plots), evaluate, register, and compare with earlier versions."""
    run = get_run(key)
    tracking.set_tags(cfg, run_id, {"hindsight.run_dir": str(cfg.root.resolve())})
    if run.start_step:
        tracking.set_tags(cfg, run_id, {"hindsight.resumed_from_step": run.start_step})
    _watch(cfg, key, run_id, run.start_step, {"eval/accuracy": evaluate_task(key)})
    progress = StepProgress("rl", cfg.rl.steps, run.start_step)
    try:
        for step in range(run.start_step, cfg.rl.steps):
            done = step + 1
            rollout = rollout_task(key, step)
            metrics = {**_numeric(rollout), **_numeric(score_task(key, step)), **update_task(key, step)}
            if done % cfg.rl.eval_every == 0 or done == cfg.rl.steps:
                metrics["eval/accuracy"] = evaluate_task(key)
            if rollout.get("replay/ids"):
                tracking.log_json(cfg, run_id, {"step": step, "ids": rollout["replay/ids"]}, f"replay/step-{step:06d}.json")
            progress.advance(done, f"reward {metrics['reward/mean']:.3f} kl {metrics.get('kl', 0.0):.4f}")
            _watch(cfg, key, run_id, done, metrics)
    finally:
        progress.close()
    final_acc = run.monitor.history[-1]["eval/accuracy"]  # the last step always evaluates
    version = tracking.register(cfg, run_id, run.ckpt.policy_dir(cfg.rl.steps), f"{cfg.name}-policy")
    if cfg.eval.compare_versions:
        tracking.log_artifact(cfg, run_id, compare_versions(cfg, run.init_path, cfg.rl.init or sft_uri(cfg)), "reports")
    tracking.end_run(cfg, run_id)
    return {"stage": "rl", "model": f"{cfg.name}-policy", "version": version, "run_id": run_id,
            "eval/accuracy": final_acc, "wall_s": time.perf_counter() - t0}


def _watch(cfg: PipelineConfig, key: str, run_id: str, done: int, metrics: dict) -> None:
    """Log the step, run the alert rules, and write the report and plots when one is due.

    A `stop` alert first writes a checkpoint at this step, so rerunning the command resumes here.
    """
    run = get_run(key)
    tracking.log_metrics(cfg, run_id, metrics, done)
    alerts = run.observe(done, metrics)
    for alert in alerts:
        print(f"ALERT {alert.message}")
        tracking.set_tags(cfg, run_id, {f"hindsight.alert.{alert.rule}": alert.message})
    if alerts:
        tracking.log_artifact(cfg, run_id, run.dir / "alerts.jsonl")
    if done and (done % cfg.rl.report_every == 0 or done == cfg.rl.steps) and "reward/mean" in metrics:
        report, *plots = report_task(key, done)
        tracking.log_artifact(cfg, run_id, report, "reports")
        for plot in plots:
            tracking.log_artifact(cfg, run_id, plot, "plots")
    stops = [a for a in alerts if a.action == "stop"]
    if stops:
        raise AlertStop(f"stopped by alert at step {done}: {stops[0].message.split(': ', 1)[1]}. "
                        f"{_checkpoint_for_resume(run, done)}; rerun the same command to resume (change or "
                        f"remove the rule under rl.alerts first if it would fire again)")


def _checkpoint_for_resume(run, done: int) -> str:
    """Save the state a stop leaves behind, unless the update already broke the weights."""
    if done and run.weights_finite():
        run.checkpoint(done)
        return f"A checkpoint was saved at step {done}"
    return (f"The weights are not finite, so nothing was saved; the newest good checkpoint is at step "
            f"{run.ckpt.latest_step() or 0}")


def _numeric(d: dict) -> dict:
    return {k: v for k, v in d.items() if isinstance(v, (int, float))}
