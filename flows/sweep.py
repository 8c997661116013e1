"""Sweep: shared SFT and reward model once, then concurrent RL trials, ranked; the best is NAME-policy@best."""
from __future__ import annotations

import json

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from flows.reward_model import reward_model_flow
from flows.sft import sft_flow
from hindsight.config import PipelineConfig
from hindsight.console import say
from hindsight.fsutil import atomic_write_bytes
from hindsight.progress import Ticker
from hindsight.stage import model_name
from hindsight.config.sweep import SweepConfig, rank, trial_config, trial_id, trial_params
import tracking
from tasks.cache import stage_key
from hindsight.lookback.sweep import ranking_table, sweep_plots
from tasks.sweep import deployment_trial_task, trial_task


@flow(name="sweep", log_prints=False)
def sweep_flow(sweep: SweepConfig, base: PipelineConfig, force: bool = False, sweep_file: str = "sweep") -> dict:
    trials = [trial_config(sweep, base, i, p, sweep_file) for i, p in enumerate(trial_params(sweep))]
    shared = _shared_stages(base, force)
    key = stage_key("sweep", {"sweep": sweep.model_dump(), "base": base.model_dump()}, shared, tracking.store_id(base))
    parent = tracking.sweep_parent_run(base, sweep.name, key)
    tracking.log_json(base, parent, sweep.model_dump(), "sweep/sweep.json")
    say(f"sweep {sweep.name}: {len(trials)} trials, {sweep.max_concurrency} at a time")
    results = _run_trials(sweep, trials, parent, shared, force)
    ranked = rank(results, sweep.metric, sweep.mode)
    table = ranking_table(ranked, list(sweep.params), sweep.metric)
    say(table)
    _publish(base, sweep, parent, ranked, table)
    stopped = {f"hindsight.stopped.{r['trial']}": r["why"] for r in ranked if r.get("status") == "stopped"}
    if stopped:
        tracking.set_tags(base, parent, stopped)
    best = next((r for r in ranked if r["rank"] == 1), None)
    if best:
        tracking.client(base).set_registered_model_alias(model_name(base, "policy"), "best", best["version"])
        tracking.set_tags(base, parent, {"hindsight.best_trial": best["trial"], "hindsight.best_version": best["version"]})
        tracking.log_metrics(base, parent, {f"best/{sweep.metric}": best[sweep.metric]}, 0)
    tracking.end_run(base, parent, "FINISHED" if best else "FAILED")
    return {"stage": "sweep", "trials": ranked, "best": best, "parent_run_id": parent}


def _shared_stages(base: PipelineConfig, force: bool) -> dict:
    """SFT and the reward model every trial starts from (cached after the first sweep or pipeline)."""
    versions = {}
    if base.sft.enabled:
        versions["sft"] = sft_flow(base, force=force).version
    if base.reward_model.enabled:
        versions["rm"] = reward_model_flow(base, force=force).version
    return versions


def _run_trials(sweep: SweepConfig, trials: list[PipelineConfig], parent: str, shared: dict, force: bool) -> list[dict]:
    """Submit every trial; a failed one is recorded and the others carry on."""
    params = trial_params(sweep)
    task = deployment_trial_task if sweep.deployment else trial_task
    runner = task.with_options(refresh_cache=force, task_run_name="trial-{trial}")
    where = {"deployment": sweep.deployment} if sweep.deployment else {"api_url": prefect_api_url()}
    store = tracking.store_id(trials[0])  # trials differ in RL keys only, never in the tracking store
    with ThreadPoolTaskRunner(max_workers=sweep.max_concurrency) as pool:
        futures = []
        for i, cfg in enumerate(trials):
            key = stage_key("trial", {"cfg": cfg.model_dump(), "metric": sweep.metric}, shared, store)
            futures.append(pool.submit(runner, parameters={
                "cfg": cfg, "trial": trial_id(i), "params": params[i], "parent_run_id": parent,
                "metric": sweep.metric, "cache_key": key, **where}))
        results = []
        with Ticker(f"sweep {sweep.name}", len(futures), "trials finished", every_s=30.0) as ticker:
            for i, fut in enumerate(futures):
                state = fut.wait() or fut.state
                if state.is_completed():
                    results.append(fut.result())
                else:
                    err = state.result(raise_on_failure=False)
                    say(f"trial {trial_id(i)} failed: {err}")
                    results.append({"trial": trial_id(i), **params[i], "status": "failed", "error": str(err)})
                ticker.update(len(results))
    return results


def _publish(base: PipelineConfig, sweep: SweepConfig, parent: str, ranked: list[dict], table: str) -> None:
    out = base.root.parent / sweep.name
    atomic_write_bytes(out / "ranking.txt", (table + "\n").encode())
    atomic_write_bytes(out / "ranking.json", json.dumps(ranked, indent=1, default=str).encode())
    for path in [out / "ranking.txt", out / "ranking.json", *sweep_plots(out, [r for r in ranked if r.get("run_dir")])]:
        tracking.log_artifact(base, parent, path, "sweep")


def prefect_api_url() -> str | None:
    """The Prefect API this flow talks to (the CLI's local server, or a deployment's), for the trials'
    processes; unset only when no server is configured, and then each trial runs without one."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url
