"""Look-back that needs MLflow: registered versions side by side, run comparison, run lookup."""
from __future__ import annotations

import math
from pathlib import Path

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from hindsight.config import PipelineConfig
from hindsight.data.chat import display_prompt
from hindsight.errors import ConfigError
from hindsight.scoring.evaluate import judge
from hindsight.fsutil import atomic_write_bytes
from hindsight.models.load import load_causal_lm, load_tokenizer
from hindsight.lookback.rebuild import owns
from hindsight.state.rundir import RunDir
from hindsight.lookback.report import render_versions_report, text_table
from hindsight.lookback.metrics import watch_order
from hindsight.stage import model_name
import tracking
from hindsight.scoring.evaluate import eval_rows, judge_worker


def compare_versions(cfg: PipelineConfig, init_path: str, init_label: str) -> Path:
    """The RL start point and the newest registered policy versions answer the same eval prompts."""
    c = tracking.client(cfg)
    name = model_name(cfg, "policy")
    versions = sorted(c.search_model_versions(f"name='{name}'"), key=lambda v: int(v.version))
    versions = versions[-cfg.eval.compare_versions:]
    rows = eval_rows(cfg)[: cfg.eval.compare_prompts]
    models = [(f"init ({init_label})", init_path)]
    models += [(f"{name} v{v.version}", tracking.resolve_model(cfg, f"models:/{name}/{v.version}", "rl")[0])
               for v in versions]
    answers = {}
    for label, path in models:
        model = load_causal_lm(path, cfg.model.dtype).eval()
        with judge_worker(cfg) as worker:
            answers[label] = judge(model, load_tokenizer(path), rows, cfg.eval.reward, cfg.eval.max_new_tokens,
                                   worker, cfg.rl.scoring.timeout_s, cfg.rl.scoring.fallback, cfg.rl.rollout.multi_turn)
        del model
    out = RunDir.of(cfg).rl.versions_report
    prompts = [display_prompt(r["prompt"]) for r in rows]  # chat prompts are turns, not text
    atomic_write_bytes(out, render_versions_report(cfg.name, prompts, answers).encode("utf-8"))
    return out


def client_for(uri: str | None) -> MlflowClient:
    """The store named on the command line, else $MLFLOW_TRACKING_URI, else ./mlflow.db (as the stages use)."""
    return tracking.client(PipelineConfig.model_validate({"tracking": {"tracking_uri": uri}}))


def find_run(c: MlflowClient, ref: str):
    """A run by id, or by name (the newest run with that name), or by stage (the newest run of
    that stage: `rl`), across experiments."""
    try:
        return c.get_run(ref)
    except MlflowException:
        pass
    exps = [e.experiment_id for e in c.search_experiments()]
    runs = []
    for where in (f"attributes.run_name = '{ref}'", f"tags.`hindsight.stage` = '{ref}'") if "'" not in ref else ():
        runs = runs or (c.search_runs(exps, filter_string=where, order_by=["attributes.start_time DESC"],
                                      max_results=1) if exps else [])
    if not runs:
        raise ConfigError(f"run {ref!r} not found in the MLflow store at {c.tracking_uri}")
    return runs[0]


def run_dir_of(c: MlflowClient, ref: str) -> Path:
    """The run directory an RL run's tag names, if that directory records the run: a crafted tag
    must not point a report at another run's files."""
    run = find_run(c, ref)
    path = run.data.tags.get("hindsight.run_dir")
    if not path:
        raise ConfigError(f"run {ref!r} has no hindsight.run_dir tag (only RL stage runs store rollouts)")
    if not owns(RunDir(path).rl.path, run.info.run_id):
        raise ConfigError(f"run {ref!r}: its hindsight.run_dir tag names {path}, which does not record that run "
                          f"(rl/{RunDir(path).rl.run_ids.name}); refusing to read it")
    return Path(path)


def compare_runs(c: MlflowClient, ref_a: str, ref_b: str) -> str:
    """Final metrics side by side, then the config keys whose values differ."""
    a, b = find_run(c, ref_a), find_run(c, ref_b)
    names = [f"{r.info.run_name} {r.info.run_id[:8]}" for r in (a, b)]
    rows = []
    for k in sorted(set(a.data.metrics) | set(b.data.metrics), key=watch_order):  # what one reads first, first
        va, vb = a.data.metrics.get(k), b.data.metrics.get(k)
        delta = f"{vb - va:+.4g}" if va is not None and vb is not None and math.isfinite(vb - va) else ""
        rows.append([k, va, vb, delta])
    diff = sorted(k for k in set(a.data.params) | set(b.data.params) if a.data.params.get(k) != b.data.params.get(k))
    params = [[k, a.data.params.get(k, "-"), b.data.params.get(k, "-")] for k in diff]
    return "\n".join([text_table(["metric", *names, "delta"], rows), "", f"config differences ({len(diff)}):",
                      text_table(["key", *names], params) if params else "  (none)"])


def rl_dir_for(ref: str, uri: str | None) -> Path:
    """A run directory given as a path, or the one an RL run's tag names (checked, as for reports)."""
    from hindsight.lookback.rebuild import rl_dir_of

    return rl_dir_of(ref if Path(ref).exists() else run_dir_of(client_for(uri), ref))


def compare_prompts(ref_a: str, ref_b: str, step: int | None, evals: bool, out: Path | None,
                    uri: str | None) -> tuple[Path, str]:
    """HTML of two runs' answers to the same prompts (`hindsight compare --step/--eval`), and a line."""
    from hindsight.lookback.compare import eval_step, line_up_evals, line_up_steps, render_evals, render_steps
    from hindsight.lookback.rebuild import tokenizer_for
    from hindsight.state.store import RolloutStore

    a, b = rl_dir_for(ref_a, uri), rl_dir_for(ref_b, uri)
    names = (a.parent.name, b.parent.name) if a.parent.name != b.parent.name else (str(a.parent), str(b.parent))
    if evals:
        n = eval_step(a, step)
        eval_step(b, n)  # both evaluated after it, or one error naming the run that did not
        pairs = line_up_evals(a, b, n)
        text = render_evals(names, n, pairs)
        summary = f"{len(pairs)} eval prompts after step {n}: " + ", ".join(
            f"{name} {sum(1 for p in pairs if p[k] is not None and p[k]['correct'])} correct"
            for k, name in enumerate(names))
    else:
        n = step if step is not None else max(RolloutStore(a).steps("scores"), default=0) + 1
        pairs = line_up_steps(a, b, n)
        tok_a, tok_b = tokenizer_for(a), tokenizer_for(b)
        text = render_steps(names, n, pairs, (lambda i: tok_a.decode([i]), lambda i: tok_b.decode([i])))
        summary = f"{len(pairs)} prompts of step {n}; {sum(t is not None for _, t in pairs)} also sampled by {names[1]}"
    kind = "eval" if evals else "step"
    path = out or Path(f"compare-{a.parent.name}-{b.parent.name}-{kind}-{n}.html")
    atomic_write_bytes(path, text.encode("utf-8"))
    return path, summary
