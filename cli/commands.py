"""The `hindsight` command's commands. It sits above flows/ (cli -> flows -> tasks -> core); flows
are imported inside commands so `--help` stays fast, and the `run` commands are generated from
the stage registry (flows/registry.py), which imports no flow."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from cli.runtime import env, guard, no_heartbeats, prefect_api, quiet_logs
from flows import registry

# typer 0.29 prints a flag's type as `<bool>` (as if it took a value): an empty metavar says it does not
ConfigOpt = typer.Option(..., "-c", "--config", help="pipeline YAML (see configs/)", metavar="PATH")
SetOpt = typer.Option(None, "--set", help="override a key: --set rl.steps=5 (repeatable)", metavar="KEY=VALUE")
ForceOpt = typer.Option(False, "--force", help="retrain: ignore the cache and move the stage's old state aside "
                                                "(kept under RUN_DIR/STAGE.old-TIME), never resuming from it", metavar="")
DebugOpt = typer.Option(False, "--debug", help="show full tracebacks", metavar="")
SmokeOpt = typer.Option(False, "--smoke", help="the config's smoke-size preset (its `smoke:` block): a finished "
                                                "run in minutes on a laptop CPU", metavar="")
NewRunOpt = typer.Option(False, "--force-new-run", hidden=True)  # = --force; still taken, not shown in --help


def _run_stage(stage: str, config: Path, sets: Optional[list[str]], force: bool, debug: bool, smoke: bool = False,
               force_new_run: bool = False, parent_run_id: Optional[str] = None, result_json: Optional[Path] = None):
    from hindsight.config import load_config

    env()

    def go():
        from hindsight.state.runlock import run_lock

        cfg = load_config(config, sets or [], smoke=smoke)
        prefect_api()
        with run_lock(cfg.root):  # held from before --force moves anything to the last stage
            if force_new_run:
                from hindsight.state.rundir import RunDir

                moved = RunDir.of(cfg).move_aside("rl")
                if moved:
                    typer.echo(f"moved previous RL state to {moved}")
            stage_flow = registry.stage(stage).load_flow()  # imports Prefect, which sets up its log handlers
            if not debug:
                quiet_logs()  # so filter them now
            extra = {"parent_run_id": parent_run_id} if parent_run_id else {}
            with no_heartbeats():
                result = stage_flow(cfg, force=force, **extra)
        rows = [r.row() for r in (result if isinstance(result, list) else [result])]
        from cli.summary import explain_cached, print_summary, where_to_look

        print_summary(rows)
        explain_cached(cfg, rows)
        where_to_look(cfg)
        if result_json:
            import json

            result_json.write_text(json.dumps(rows if isinstance(result, list) else rows[0], default=str))
        return result

    return guard(go, debug)


def _stage_command(stage: registry.Stage):
    """`hindsight run NAME` for a registered stage: the same options for each, and for those whose
    state resumes (rl, pipeline) --force-new-run and the hidden ones a sweep's trial passes."""
    if stage.resume_flags:
        def command(config: Path = ConfigOpt, set_: Optional[list[str]] = SetOpt, force: bool = ForceOpt,
                    debug: bool = DebugOpt, smoke: bool = SmokeOpt, force_new_run: bool = NewRunOpt,
                    parent_run_id: Optional[str] = typer.Option(None, "--parent-run-id", hidden=True),
                    result_json: Optional[Path] = typer.Option(None, "--result-json", hidden=True)):
            _run_stage(stage.name, config, set_, force or force_new_run, debug, smoke, force_new_run, parent_run_id,
                       result_json)
    else:
        def command(config: Path = ConfigOpt, set_: Optional[list[str]] = SetOpt, force: bool = ForceOpt,
                    debug: bool = DebugOpt, smoke: bool = SmokeOpt):
            _run_stage(stage.name, config, set_, force, debug, smoke)
    command.__doc__ = stage.help
    return command


def sweep(config: Path = typer.Option(..., "-c", "--config", help="sweep YAML (see configs/sweep-demo.yaml)"),
          set_: Optional[list[str]] = typer.Option(None, "--set", help="override a sweep key, e.g. max_concurrency=1"),
          force: bool = ForceOpt, debug: bool = DebugOpt):
    """Grid or random search over config keys: concurrent RL trials, ranked; the best is NAME-policy@best."""
    env()

    def go():
        from hindsight.stage import model_name
        from hindsight.config.sweep import load_sweep

        sweep_cfg, base, _ = load_sweep(config, set_ or [])
        prefect_api()
        from flows.sweep import sweep_flow

        if not debug:
            quiet_logs()
        result = sweep_flow(sweep_cfg, base, force=force, sweep_file=str(config))
        if result["best"] is None:
            from hindsight.errors import StageError

            raise StageError(f"sweep {sweep_cfg.name}: every trial failed (logs under {base.root.parent / sweep_cfg.name})")
        best = result["best"]
        typer.echo(f"best: {best['trial']} {sweep_cfg.metric}={best[sweep_cfg.metric]:.4g} -> "
                   f"{model_name(base, 'policy')} v{best['version']} (alias @best)")

    guard(go, debug)


TrackingOpt = typer.Option(None, "--tracking-uri", help="MLflow store; default $MLFLOW_TRACKING_URI, else ./mlflow.db")


def report(run: str = typer.Argument(..., help="run directory (runs/NAME) or the RL stage's MLflow run id or name"),
           step: Optional[int] = typer.Option(None, "--step", help="RL step (1-based, as in MLflow); default the last"),
           out: Optional[Path] = typer.Option(None, "--out", help="default RUN_DIR/rl/reports/step-N.html"),
           groups: int = typer.Option(4, "--groups", help="prompt groups to show"),
           tracking_uri: Optional[str] = TrackingOpt, debug: bool = DebugOpt):
    """Regenerate the HTML rollout report of any past RL step from its stored rollouts."""
    env()

    def go():
        from hindsight.lookback.rebuild import rl_dir_of, tokenizer_for, write_step_report
        from hindsight.state.store import RolloutStore

        path = Path(run)
        if not path.exists():
            from tracking.lookback import client_for, run_dir_of

            path = run_dir_of(client_for(tracking_uri), run)
        rl_dir = rl_dir_of(path)
        stored = RolloutStore(rl_dir).steps("scores")
        n = step if step is not None else (stored[-1] + 1 if stored else 1)
        written = write_step_report(rl_dir, n, tokenizer_for(rl_dir), rl_dir.parent.name, groups, out)
        typer.echo(f"wrote {written}")

    guard(go, debug)


def compare(run_a: str = typer.Argument(..., help="MLflow run id or name (or, with --step/--eval, a run directory)"),
            run_b: str = typer.Argument(..., help="MLflow run id or name (or, with --step/--eval, a run directory)"),
            step: Optional[int] = typer.Option(None, "--step", help="line up the prompts both runs sampled, at "
                                                                    "this RL step (1-based), as HTML"),
            eval_: bool = typer.Option(False, "--eval", help="line up both runs' greedy eval answers (after --step, "
                                                             "default the last eval), as HTML"),
            out: Optional[Path] = typer.Option(None, "--out", help="HTML file; default compare-A-B-step-N.html"),
            tracking_uri: Optional[str] = TrackingOpt, debug: bool = DebugOpt):
    """Final metrics side by side, and the config keys that differ, for two MLflow runs; with
    --step or --eval, what each run answered to the same prompts, side by side."""
    env()

    def go():
        if step is None and not eval_:
            from tracking.lookback import client_for, compare_runs

            typer.echo(compare_runs(client_for(tracking_uri), run_a, run_b))
            return
        from tracking.lookback import compare_prompts

        written, summary = compare_prompts(run_a, run_b, step, eval_, out, tracking_uri)
        typer.echo(f"{summary}\nwrote {written}")

    guard(go, debug)


def scale(run_dir: Path = typer.Argument(..., help="the run directory (runs/NAME) of a running RL stage"),
          rollout: int = typer.Option(..., "--rollout", help="rollout workers from the next step on"),
          wait: float = typer.Option(30.0, "--wait", help="seconds to wait for the run to apply or refuse it"),
          debug: bool = DebugOpt):
    """Change a running RL stage's rollout workers (rl.workers.placement: ray). A new worker takes
    leases from the next step, after it has synced the current weights version."""
    def go():
        from hindsight.coordination.scale import request_scale, scale_outcome

        path = request_scale(run_dir, rollout)
        outcome = scale_outcome(path, wait_s=wait)
        if outcome is None:
            typer.echo(f"wrote {path}: {rollout} rollout worker(s) from the next step (not applied yet)")
        else:
            typer.echo(f"{path.parent}: {outcome}")

    guard(go, debug)


def server_start(port: Optional[int] = typer.Option(None, "--port", help="default the first free port from 4200"),
                 debug: bool = DebugOpt):
    """Start Prefect's server on loopback, detached; `hindsight run` commands then use it."""
    def go():
        from cli.server import start

        info, started = start(port)
        typer.echo(f"{'started' if started else 'already running:'} Prefect server at {info['url']} "
                   f"(pid {info['pid']}, log {info['log']})")

    env()
    guard(go, debug)


def server_stop():
    """Stop the local Prefect server."""
    from cli.server import stop

    info = stop()
    typer.echo(f"stopped the Prefect server at {info['url']} (pid {info['pid']})" if info else "no local Prefect server runs")


def server_status():
    """Whether the local Prefect server runs, and where (exit 1 when it does not)."""
    from cli.server import status

    info = status()
    if info is None:
        typer.echo("no local Prefect server runs (`hindsight server start` starts one)")
        raise typer.Exit(1)
    typer.echo(f"Prefect server at {info['url']} (pid {info['pid']}, log {info['log']})")


def sync(run_dir: Path = typer.Argument(..., help="the run directory (runs/NAME) whose MLflow writes were spooled"),
         tracking_uri: Optional[str] = TrackingOpt, debug: bool = DebugOpt):
    """Send what a run spooled while the MLflow server was unreachable (metrics, tags, params,
    artifacts, its final status), and complete a registration that could not happen. The store
    is the configured one (--tracking-uri, $MLFLOW_TRACKING_URI, ./mlflow.db), never one named
    in the spool; each spooled line is checked before it is sent."""
    def go():
        from hindsight.config import PipelineConfig
        from hindsight.errors import ConfigError
        from hindsight.state.runlock import run_lock
        from tracking.spool import Spool
        from tracking import sync_spool, tracking_uri as configured

        spool = Spool(run_dir)
        if not run_dir.is_dir():
            raise ConfigError(f"{run_dir}: no such run directory")
        pending = spool.pending()
        if not pending:
            typer.echo(f"{run_dir}: nothing spooled, MLflow has everything")
            return
        uri = configured(PipelineConfig.model_validate({"tracking": {"tracking_uri": tracking_uri}}))
        written_for = {op.get("uri") for _, op in pending if isinstance(op, dict)}
        if written_for - {uri}:
            raise ConfigError(f"{spool.ops}: spooled for {', '.join(sorted(map(str, written_for - {uri})))}, but this "
                              f"sync would send to {uri}; pass --tracking-uri (or set MLFLOW_TRACKING_URI) to the "
                              f"store the run wrote to")
        with run_lock(run_dir):
            sent = sync_spool(run_dir, uri)
        registered = [f"{op['model_name']} v{spool.registered_version(op['run_id'])}" for _, op in pending
                      if op["op"] == "register"]
        typer.echo(f"{run_dir}: sent {sent} spooled tracking write(s) to {uri}"
                   + (f"; registered {', '.join(registered)}" if registered else ""))

    env()
    guard(go, debug)


def data_build(out: Optional[Path] = typer.Option(None, "--out", help="output folder (default: data, data-tools "
                                                                       "for --demo tool_sums, data-gsm8k for gsm8k_format)"),
               seed: int = typer.Option(0, help="seed; 0 reproduces the md5 pinned in data.dvc (data-tools.dvc)"),
               check: Optional[Path] = typer.Option(None, help="compare with this .dvc pin (default: data.dvc, or "
                                                              "data-tools.dvc for --demo tool_sums)"),
               demo: str = typer.Option("sums", help="sums (the default demo), tool_sums (the multi-turn demos) or "
                                                       "gsm8k_format (the GSM8K-format recipe's word problems)")):
    """Regenerate the demo data deterministically."""
    from hindsight.data.demo import demo_data
    from hindsight.data.rows import dvc_dir_md5, pinned_md5

    try:
        _, build = demo_data(demo)
    except ValueError as exc:
        typer.secho(f"error: --demo {exc}", fg="red", err=True)
        raise typer.Exit(2) from None
    name = {"tool_sums": "data-tools", "gsm8k_format": "data-gsm8k"}.get(demo, "data")
    out, check = out or Path(name), check or Path(f"{name}.dvc")
    build(out, seed=seed)
    md5 = dvc_dir_md5(out)
    typer.echo(f"wrote {out} (md5 {md5})")
    if check and check.is_file():
        pinned = pinned_md5(check)
        if pinned != md5:
            typer.secho(f"error: md5 differs from {check} ({pinned})", fg="red", err=True)
            raise typer.Exit(1)
        typer.echo(f"matches {check}")


def model_import(src: str = typer.Argument(..., help="a .gguf model file, or pkg://PACKAGE/FILE (a file an installed "
                                                   "package ships)"),
                 out: Path = typer.Argument(..., help="the Hugging Face folder to write (new, or an earlier import)"),
                 debug: bool = typer.Option(False, "--debug", help="show tracebacks")):
    """De-quantize a GGUF model into a plain folder that trains, saves, and loads with plain
    transformers (what `model.base: x.gguf` does once, into a cache)."""
    def go():
        from hindsight.errors import ConfigError
        from hindsight.models.gguf import import_gguf, package_file

        path = Path(package_file(src, field="model import")).expanduser()  # a str: Path would fold pkg://'s //
        if not path.is_file():
            raise ConfigError(f"{src}: no such file (expected a .gguf model file)")
        folder = import_gguf(path, out, field="model import")
        typer.echo(f"imported {src} into {folder} (full precision; its checksums in {folder}/hindsight-import.json)")

    guard(go, debug)


def build_app() -> typer.Typer:
    """The command tree, with a `run` command per registered stage (read when it is built)."""
    app = typer.Typer(add_completion=False, no_args_is_help=True, help="hindsight: post-training you can look back on.")
    run_app = typer.Typer(no_args_is_help=True, help="Run a stage (or the whole pipeline) from a config.")
    server_app = typer.Typer(no_args_is_help=True, help="The local Prefect server every command shares.")
    data_app = typer.Typer(no_args_is_help=True, help="Demo data.")
    app.add_typer(run_app, name="run")
    app.add_typer(data_app, name="data")
    for stage in registry.STAGES:
        run_app.command(stage.name)(_stage_command(stage))
    app.command("sweep")(sweep)
    app.command("report")(report)
    app.command("compare")(compare)
    app.command("scale")(scale)
    app.add_typer(server_app, name="server")
    server_app.command("start")(server_start)
    server_app.command("stop")(server_stop)
    server_app.command("status")(server_status)
    app.command("sync")(sync)
    data_app.command("build")(data_build)
    model_app = typer.Typer(no_args_is_help=True, help="Models from where users have them.")
    app.add_typer(model_app, name="model")
    model_app.command("import")(model_import)
    return app
