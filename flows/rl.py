"""RL stage: rollout -> score -> update, repeated; rollouts persisted between the steps.

The stage task is cached like the others, and retried: a retry reopens the run directory
and resumes from its newest checkpoint, training on stored rollouts before sampling anew.
"""
from __future__ import annotations

import logging
from pathlib import Path

from prefect import flow

from flows.common import run_declared, transient
from hindsight.config import PipelineConfig
from hindsight.console import say
from hindsight.data.rows import format_mismatch
from hindsight.errors import AlertStop, EarlyStopped, Preempted
from hindsight.faults import crash_point
from hindsight.fsutil import append_line
from hindsight.state.rundir import RunDir
from hindsight.state.fingerprint import check_not_finished
from hindsight.preemption import Preemption
from hindsight.rollout.engines import get_engine
from hindsight.rollout.pools import POOLS, pool_name
from hindsight.progress import StepProgress
from hindsight.stage import StageContext, StageOutput, StageResult, StageSpec, model_uri
import tracking

log = logging.getLogger("hindsight")

# The RL run's tasks, checkpoints and exports import torch and transformers (seconds): they are
# imported in the functions that run them, so a cached rerun, which loads this flow and trains
# nothing, does not pay for them.


def rl_story(ctx: StageContext) -> StageOutput:
    """Evaluate, then rollout -> score -> update per step while watching the metrics (alerts,
    reports, plots), and once the policy is registered, compare it with earlier versions."""
    from tasks.rl import close_run, get_run, open_run

    cfg, run_id = ctx.cfg, ctx.run_id
    # from the first model load on: a node reclaimed while the run starts stops cleanly too
    with Preemption() as preemption:
        key = open_run(cfg, ctx.inputs["rl.init"], ctx.inputs["reward_model"])
        try:
            run = get_run(key)
            check_not_finished(run.dir, run.start_step, cfg.rl.steps)
            append_line(run.paths.run_ids, run_id)  # `hindsight report RUN_ID` reads a folder only if it says so
            tracking.set_tags(cfg, run_id, {"hindsight.run_dir": str(cfg.root.resolve())})
            tracking.log_decoding(cfg, run_id, run.decoding)
            _announce_resume(cfg, run_id, run)
            _watch(cfg, key, run_id, run.start_step, {"eval/accuracy": _evaluate(cfg, key, run_id, run.start_step)})
            _steps(cfg, key, run_id, run.start_step, preemption)
            final_acc = run.monitor.history[-1]["eval/accuracy"]  # the last step always evaluates
            policy_dir, init_path = run.ckpt.policy_dir(cfg.rl.steps), run.init_path
        finally:
            close_run(key)

    def compare(run_id: str) -> None:
        from tracking.lookback import compare_versions

        crash_point("lookback", 0)
        if cfg.eval.compare_versions:
            report = compare_versions(cfg, init_path, cfg.rl.init or model_uri(cfg, "sft"))
            tracking.log_artifact(cfg, run_id, report, "reports")

    policy_dir, tags = _portable(cfg, policy_dir, init_path)
    return StageOutput(model_dir=policy_dir, eval_accuracy=final_acc, then=compare, tags=tags)


def _portable(cfg: PipelineConfig, policy_dir, init_path: str):
    """What is registered loads from any directory: a LoRA policy's checkpoint is the adapter on a
    relative cache folder, so it is merged into a plain model (`rl.lora.registered: merged`) or
    exported with its base named by a URI that resolves (`registered: adapter`)."""
    lora = cfg.rl.lora
    if not lora.enabled:
        return policy_dir, {}
    from hindsight.models.export import export_adapter, export_merged

    export = RunDir.of(cfg).rl.export_policy
    tags = {"hindsight.adapter": f"lora r={lora.r} alpha={lora.alpha}", "hindsight.lora_registered": lora.registered}
    if lora.registered == "merged":
        return export_merged(policy_dir, export), tags
    base = tracking.base_reference(cfg, cfg.rl.init or model_uri(cfg, "sft"), init_path)
    return export_adapter(policy_dir, export, base), {**tags, "hindsight.base_model": base}


def _steps(cfg: PipelineConfig, key: str, run_id: str, start: int, preemption: Preemption) -> None:
    from hindsight.lookback.curve import run_curves
    from hindsight.lookback.metrics import recorded
    from hindsight.state.checkpoint import checkpoint_spans
    from tasks.rl import get_run, steps_task

    if preemption.requested:  # while the run started: nothing was trained that a checkpoint lacks
        raise Preempted(f"preempted by {preemption.name()} before step {start} of {cfg.rl.steps}: nothing was "
                        f"trained yet; rerun the same command to resume from step {start}", preemption.received)
    progress = StepProgress("rl", cfg.rl.steps, start)

    def after_step(step: int, out: dict) -> None:
        """After each step: evaluate when due, record replayed prompts, show progress, watch; on
        SIGTERM, checkpoint the step and stop."""
        done, metrics = step + 1, recorded(_numeric(out))  # the names history, alerts and MLflow share
        if done % cfg.rl.eval_every == 0 or done == cfg.rl.steps:
            metrics["eval/accuracy"] = _evaluate(cfg, key, run_id, done)
        if out.get("replay/ids"):
            tracking.log_json(cfg, run_id, {"step": done, "ids": out["replay/ids"]}, f"replay/step-{done:06d}.json")
        metrics.update(run_curves(get_run(key).monitor.history + [{"step": done, **metrics}],
                                  cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt, cfg.lookback.curve_min_points,
                                  cfg.rl.steps))
        plateau = f" → {metrics['reward/curve/asymptote']:.3f}" if "reward/curve/asymptote" in metrics else ""
        progress.advance(done, f"reward {metrics['reward/mean']:.3f}{plateau} kl {metrics.get('policy/kl', 0.0):.4f}")
        _watch(cfg, key, run_id, done, metrics)
        if preemption.requested and done < cfg.rl.steps:
            get_run(key).checkpoint(done)
            raise Preempted(f"preempted by {preemption.name()} after step {done} of {cfg.rl.steps}: its checkpoint "
                            f"is written under {RunDir.of(cfg).rl.checkpoints}; rerun the same command to resume "
                            f"from step {done}", preemption.received)

    # one task per checkpoint interval: a retried task continues at the step that failed and
    # redoes only the groups not yet written; a failure once an update has begun is not
    # retried here (training is not idempotent): the stage's retry resumes from the checkpoint
    steps_run = steps_task.with_options(retries=cfg.retries.count, retry_delay_seconds=cfg.retries.delay_s,
                                        retry_condition_fn=lambda *a: transient(*a) and not get_run(key).updating)
    try:
        for first, last in checkpoint_spans(start, cfg.rl.steps, cfg.rl.save_every):
            steps_run(key, first, last, after_step)
    finally:
        progress.close()


def _announce_resume(cfg: PipelineConfig, run_id: str, run) -> None:
    """Say where a resume starts, and record every setting it changed, at the step it changed."""
    from hindsight.lookback.metrics import recorded_name

    start = run.start_step
    reused = [s for s in run.store.steps("rollouts") if s >= start]
    if start or reused:
        say(f"resuming rl from step {start} ({len(reused)} stored shards reused)")
        tracking.set_tags(cfg, run_id, {"hindsight.resumed_from_step": start})
    changes = run.resume_changes.by_section
    if changes:
        tracking.set_tags(cfg, run_id, {f"hindsight.changed.{section}.{key}": f"{old!r} -> {new!r} at step {start}"
                                        for section, diff in changes.items() for key, (old, new) in diff.items()})
        tracking.log_metrics(cfg, run_id, {recorded_name(f"config/{key}"): float(new) for diff in changes.values()
                                           for key, (_, new) in diff.items()
                                           if isinstance(new, (int, float)) and not isinstance(new, bool)}, start)


def _checks(cfg: PipelineConfig) -> None:
    """Before any model loads: one warning when SFT's prompts and RL's differ in format; the
    rollout engine and Ray checked, so a missing GPU, an unreachable cluster or a worker layout
    larger than the cluster is one clear error."""
    mismatch = format_mismatch(cfg)
    if mismatch:
        log.warning(mismatch)
    get_engine(cfg.rl.rollout.backend).require()  # the engine's own preflight (vLLM: installed, a GPU)
    if cfg.rl.rollout.multi_turn is not None:  # tools import, have schemas, environments have reset()
        from hindsight.rollout.multiturn.setup import episode_factory

        episode_factory(cfg.rl.rollout.multi_turn)
    POOLS.lookup(pool_name(cfg.rl)).preflight(cfg)  # the worker pool's own (Ray: the cluster holds the layout)


RL = StageSpec(
    name="rl", sections=("rl", "model", "data", "eval", "seed", "name", "run_dir"),
    models=lambda cfg: {"rl.init": cfg.rl.init or model_uri(cfg, "sft"),
                        "reward_model": model_uri(cfg, "rm") if cfg.rl.needs_reward_model() else None},
    data=("prompts", "eval"),
    rewards=lambda cfg: list(cfg.rl.scoring.rewards) + [cfg.eval.reward], code=lambda cfg: cfg.rl.rollout.code_specs(),
    checks=_checks, registers="policy", story=rl_story)


@flow(name="rl", log_prints=False)
def rl_flow(cfg: PipelineConfig, force: bool = False, parent_run_id: str | None = None) -> StageResult:
    return run_declared(RL, cfg, force, parent_run_id)


def _evaluate(cfg: PipelineConfig, key: str, run_id: str, done: int) -> float:
    """Held-out accuracy after `done` steps; its greedy answers become traces (off the step's path)."""
    from tasks.rl import evaluate_task

    acc, answers = evaluate_task(key, done)
    tracking.log_eval_traces(cfg, run_id, answers, done)
    return acc


def _watch(cfg: PipelineConfig, key: str, run_id: str, done: int, metrics: dict) -> None:
    """Log the step, run the alert rules, and write the report and plots when one is due.

    A `stop` alert first writes a checkpoint at this step, so rerunning the command resumes here.
    """
    from tasks.rl import get_run, report_task

    run = get_run(key)
    tracking.log_metrics(cfg, run_id, metrics, done)
    if done and "reward/mean" in metrics:  # the step's trajectories, read back from the store by the writer
        tracking.log_step_traces(cfg, run_id, run.dir, done)
    alerts = run.observe(done, metrics)
    for alert in alerts:
        say(f"ALERT {alert.message}")
        tracking.set_tags(cfg, run_id, {f"hindsight.alert.{alert.rule}": alert.message})
    if alerts:
        tracking.log_artifact(cfg, run_id, run.paths.alerts)
    if done and (done % cfg.rl.report_every == 0 or done == cfg.rl.steps) and "reward/mean" in metrics:
        report, *plots = report_task(key, done)
        tracking.log_artifact(cfg, run_id, report, "reports")
        for plot in plots:
            tracking.log_artifact(cfg, run_id, plot, "plots")
    stops = [a for a in alerts if a.action == "stop"]
    early = _early_stop(cfg, done, metrics)
    if early and not stops:
        raise EarlyStopped(f"{early}. {_checkpoint_for_resume(run, done)}")
    if stops:
        raise AlertStop(f"stopped by alert at step {done}: {stops[0].message.split(': ', 1)[1]}. "
                        f"{_checkpoint_for_resume(run, done)}; rerun the same command to resume (change or "
                        f"remove the rule under rl.alerts first if it would fire again)")


def _early_stop(cfg: PipelineConfig, done: int, metrics: dict) -> str | None:
    """In a sweep with early stop: post this trial's fit, and say why it stops if it cannot win."""
    es = cfg.lookback.early_stop
    if not es.board or not done:
        return None
    from hindsight.lookback.early_stop import leader, post, verdict

    board, trial = Path(es.board), cfg.root.name
    mine = post(board, trial, done, metrics, es.metric)
    why = verdict(mine, leader(board, trial), done, es.min_steps, es.metric)
    if why:
        say(f"stopped: {why}")
    return why


def _checkpoint_for_resume(run, done: int) -> str:
    """Save the state a stop leaves behind, unless the update already broke the weights."""
    if done and run.weights_healthy():
        run.checkpoint(done)
        return f"A checkpoint was saved at step {done}"
    return (f"The weights are not healthy (not finite, or beyond model.max_weight_abs), so nothing was saved; the "
            f"newest healthy checkpoint is at step "
            f"{run.ckpt.latest_step() or 0}")


def _numeric(d: dict) -> dict:
    return {k: v for k, v in d.items() if isinstance(v, (int, float))}
