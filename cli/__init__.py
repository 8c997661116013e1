"""The `hindsight` command. It sits above flows/ (cli -> flows -> tasks -> core); flows are imported
inside commands so `--help` stays fast."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from hindsight.errors import HindsightError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="hindsight: post-training you can look back on.")
run_app = typer.Typer(no_args_is_help=True, help="Run a stage (or the whole pipeline) from a config.")
data_app = typer.Typer(no_args_is_help=True, help="Demo data.")
app.add_typer(run_app, name="run")
app.add_typer(data_app, name="data")

# typer 0.29 prints a flag's type as `<bool>` (as if it took a value): an empty metavar says it does not
ConfigOpt = typer.Option(..., "-c", "--config", help="pipeline YAML (see configs/)", metavar="PATH")
SetOpt = typer.Option(None, "--set", help="override a key: --set rl.steps=5 (repeatable)", metavar="KEY=VALUE")
ForceOpt = typer.Option(False, "--force", help="retrain: ignore the cache and move the stage's old state aside "
                                                "(kept under RUN_DIR/STAGE.old-TIME), never resuming from it", metavar="")
DebugOpt = typer.Option(False, "--debug", help="show full tracebacks", metavar="")
NewRunOpt = typer.Option(False, "--force-new-run", help="the same as --force (kept for older scripts)", metavar="")


def _env() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' load/save bars would break ours
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # and so would MLflow's
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # and TRL's dataset preparation's
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # its links open the GenAI view: ours say where
    import warnings

    # TRL 1.16's own configs set the argument transformers 5 renamed: not the user's to fix
    warnings.filterwarnings("ignore", message=".*`gradient_checkpointing` is deprecated", category=FutureWarning)


def _no_heartbeats():
    """Flow-run heartbeats exist for the zombie-run automation of a deployment (docs/deploy.md);
    under the CLI they only cost each flow's exit a wait of up to a second for the heartbeat
    thread. Off here unless the user sets a frequency."""
    from contextlib import nullcontext

    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    if os.environ.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY") or os.environ.get("PREFECT_RUNNER_HEARTBEAT_FREQUENCY"):
        return nullcontext()
    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def _prefect_api() -> None:
    """Every flow talks to one long-lived Prefect server (cli/server.py), never a temporary one."""
    from cli.server import ensure_api

    ensure_api(lambda msg: typer.echo(msg, err=True))


def _user_error_names() -> tuple[str, ...]:
    todo, names = [HindsightError], set()
    while todo:
        cls = todo.pop()
        names.add(f"{cls.__name__}: ")
        todo += cls.__subclasses__()
    return tuple(names)


class _ForPeople(logging.Filter):
    """What Prefect logs that a person at the terminal does not need: a line per task state
    (`Finished in state Completed()`), and a bad input (a HindsightError) reported again by
    every task and flow it failed: the CLI's one `error:` line says it (--debug keeps all)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HindsightError) or isinstance(getattr(exc, "__cause__", None), HindsightError):
            return False
        msg = record.getMessage()
        if msg.startswith("Finished in state Completed(") or msg.startswith("Created task run"):
            return False
        return not any(name in msg for name in _user_error_names())


def _quiet_logs() -> None:
    """Logs a person reads, through one console: hindsight's own lines, and Prefect's with
    their noise filtered, print through the console the progress bar uses."""
    from hindsight.console import console, route_logs_to_console

    route_logs_to_console()
    for name in ("mlflow", "alembic"):  # "creating initial database tables": not news to a person
        logging.getLogger(name).setLevel(logging.WARNING)
    loggers = [logging.getLogger()] + [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)
                                       if n.startswith("prefect")]
    for handler in {h for lg in loggers for h in lg.handlers}:
        handler.addFilter(_ForPeople())
        if hasattr(handler, "console"):  # Prefect's console handler: one console, so the bar stays whole
            handler.console = console()


def _guard(fn, debug: bool):
    """One clear line and exit 1 for a user error; a traceback only with --debug."""
    try:
        return fn()
    except HindsightError as exc:
        if debug:
            raise
        from hindsight.errors import AlertStop

        stopped = isinstance(exc, AlertStop)
        typer.secho(f"{'stopped' if stopped else 'error'}: {exc}", fg="yellow" if stopped else "red", err=True)
        raise typer.Exit(3 if stopped else 1) from None


def _run_stage(stage: str, config: Path, sets: Optional[list[str]], force: bool, debug: bool,
               force_new_run: bool = False, parent_run_id: Optional[str] = None, result_json: Optional[Path] = None):
    from hindsight.config import load_config

    _env()

    def go():
        from hindsight.state.runlock import run_lock

        cfg = load_config(config, sets or [])
        _prefect_api()
        with run_lock(cfg.root):  # held from before --force moves anything to the last stage
            if force_new_run:
                from hindsight.coordination.resume import archive_run_dir

                moved = archive_run_dir(cfg.root / "rl")
                if moved:
                    typer.echo(f"moved previous RL state to {moved}")
            from flows import registry

            if not debug:
                _quiet_logs()
            extra = {"parent_run_id": parent_run_id} if parent_run_id else {}
            with _no_heartbeats():
                result = registry.FLOWS[stage](cfg, force=force, **extra)
        rows = [r.row() for r in (result if isinstance(result, list) else [result])]
        from cli.summary import explain_cached, print_summary, where_to_look

        print_summary(rows)
        explain_cached(cfg, rows)
        where_to_look(cfg)
        if result_json:
            import json

            result_json.write_text(json.dumps(rows if isinstance(result, list) else rows[0], default=str))
        return result

    return _guard(go, debug)


@run_app.command("sft")
def run_sft(config: Path = ConfigOpt, set_: Optional[list[str]] = SetOpt, force: bool = ForceOpt,
            debug: bool = DebugOpt):
    """Supervised fine-tuning (TRL SFTTrainer); registers NAME-sft."""
    _run_stage("sft", config, set_, force, debug)


@run_app.command("reward-model")
def run_reward_model(config: Path = ConfigOpt, set_: Optional[list[str]] = SetOpt, force: bool = ForceOpt,
                     debug: bool = DebugOpt):
    """Pairwise reward model (TRL RewardTrainer) from NAME-sft; registers NAME-rm."""
    _run_stage("reward-model", config, set_, force, debug)


@run_app.command("rl")
def run_rl(config: Path = ConfigOpt, set_: Optional[list[str]] = SetOpt, force: bool = ForceOpt,
           debug: bool = DebugOpt, force_new_run: bool = NewRunOpt,
           parent_run_id: Optional[str] = typer.Option(None, "--parent-run-id", hidden=True),
           result_json: Optional[Path] = typer.Option(None, "--result-json", hidden=True)):
    """RL loop (rollout -> score -> update) from NAME-sft@latest; registers NAME-policy.

    Rerunning on a run directory that holds state resumes from its newest checkpoint."""
    _run_stage("rl", config, set_, force or force_new_run, debug, force_new_run, parent_run_id, result_json)


@run_app.command("negative-ft")
def run_negative_ft(config: Path = ConfigOpt, set_: Optional[list[str]] = SetOpt, force: bool = ForceOpt,
                    debug: bool = DebugOpt):
    """Unlikelihood on the RL run's lowest-reward stored completions; registers NAME-negft."""
    _run_stage("negative-ft", config, set_, force, debug)


@run_app.command("pipeline")
def run_pipeline(config: Path = ConfigOpt, set_: Optional[list[str]] = SetOpt, force: bool = ForceOpt,
                 debug: bool = DebugOpt, force_new_run: bool = NewRunOpt):
    """The whole chain: sft -> reward-model -> rl, skipping stages whose cache is valid."""
    _run_stage("pipeline", config, set_, force, debug, force_new_run)


@app.command("sweep")
def sweep(config: Path = typer.Option(..., "-c", "--config", help="sweep YAML (see configs/sweep-demo.yaml)"),
          set_: Optional[list[str]] = typer.Option(None, "--set", help="override a sweep key, e.g. max_concurrency=1"),
          force: bool = ForceOpt, debug: bool = DebugOpt):
    """Grid or random search over config keys: concurrent RL trials, ranked; the best is NAME-policy@best."""
    _env()

    def go():
        from hindsight.stage import model_name
        from hindsight.config.sweep import load_sweep

        sweep_cfg, base, _ = load_sweep(config, set_ or [])
        _prefect_api()
        from flows.sweep import sweep_flow

        if not debug:
            _quiet_logs()
        result = sweep_flow(sweep_cfg, base, force=force, sweep_file=str(config))
        if result["best"] is None:
            from hindsight.errors import StageError

            raise StageError(f"sweep {sweep_cfg.name}: every trial failed (logs under {base.root.parent / sweep_cfg.name})")
        best = result["best"]
        typer.echo(f"best: {best['trial']} {sweep_cfg.metric}={best[sweep_cfg.metric]:.4g} -> "
                   f"{model_name(base, 'policy')} v{best['version']} (alias @best)")

    _guard(go, debug)


TrackingOpt = typer.Option(None, "--tracking-uri", help="MLflow store; default $MLFLOW_TRACKING_URI, else ./mlflow.db")


@app.command("report")
def report(run: str = typer.Argument(..., help="run directory (runs/NAME) or the RL stage's MLflow run id or name"),
           step: Optional[int] = typer.Option(None, "--step", help="RL step (1-based, as in MLflow); default the last"),
           out: Optional[Path] = typer.Option(None, "--out", help="default RUN_DIR/rl/reports/step-N.html"),
           groups: int = typer.Option(4, "--groups", help="prompt groups to show"),
           tracking_uri: Optional[str] = TrackingOpt, debug: bool = DebugOpt):
    """Regenerate the HTML rollout report of any past RL step from its stored rollouts."""
    _env()

    def go():
        from hindsight.lookback.rebuild import rl_dir_of, tokenizer_for, write_step_report
        from hindsight.state.store import RolloutStore

        path = Path(run)
        if not path.exists():
            from tasks.lookback import client_for, run_dir_of

            path = run_dir_of(client_for(tracking_uri), run)
        rl_dir = rl_dir_of(path)
        stored = RolloutStore(rl_dir).steps("scores")
        n = step if step is not None else (stored[-1] + 1 if stored else 1)
        written = write_step_report(rl_dir, n, tokenizer_for(rl_dir), rl_dir.parent.name, groups, out)
        typer.echo(f"wrote {written}")

    _guard(go, debug)


@app.command("compare")
def compare(run_a: str = typer.Argument(..., help="MLflow run id or name"),
            run_b: str = typer.Argument(..., help="MLflow run id or name"),
            tracking_uri: Optional[str] = TrackingOpt, debug: bool = DebugOpt):
    """Final metrics side by side, and the config keys that differ, for two MLflow runs."""
    _env()

    def go():
        from tasks.lookback import client_for, compare_runs

        typer.echo(compare_runs(client_for(tracking_uri), run_a, run_b))

    _guard(go, debug)


@app.command("scale")
def scale(run_dir: Path = typer.Argument(..., help="the run directory (runs/NAME) of a running RL stage"),
          rollout: int = typer.Option(..., "--rollout", help="rollout workers from the next step on"),
          debug: bool = DebugOpt):
    """Change a running RL stage's rollout workers (rl.workers.placement: ray). A new worker takes
    leases from the next step, after it has synced the current weights version."""
    def go():
        from hindsight.coordination.placement import request_scale

        typer.echo(f"wrote {request_scale(run_dir, rollout)}: {rollout} rollout worker(s) from the next step")

    _guard(go, debug)


server_app = typer.Typer(no_args_is_help=True, help="The local Prefect server every command shares.")
app.add_typer(server_app, name="server")


@server_app.command("start")
def server_start(port: Optional[int] = typer.Option(None, "--port", help="default the first free port from 4200"),
                 debug: bool = DebugOpt):
    """Start Prefect's server on loopback, detached; `hindsight run` commands then use it."""
    def go():
        from cli.server import start

        info, started = start(port)
        typer.echo(f"{'started' if started else 'already running:'} Prefect server at {info['url']} "
                   f"(pid {info['pid']}, log {info['log']})")

    _env()
    _guard(go, debug)


@server_app.command("stop")
def server_stop():
    """Stop the local Prefect server."""
    from cli.server import stop

    info = stop()
    typer.echo(f"stopped the Prefect server at {info['url']} (pid {info['pid']})" if info else "no local Prefect server runs")


@server_app.command("status")
def server_status():
    """Whether the local Prefect server runs, and where (exit 1 when it does not)."""
    from cli.server import status

    info = status()
    if info is None:
        typer.echo("no local Prefect server runs (`hindsight server start` starts one)")
        raise typer.Exit(1)
    typer.echo(f"Prefect server at {info['url']} (pid {info['pid']}, log {info['log']})")


@app.command("sync")
def sync(run_dir: Path = typer.Argument(..., help="the run directory (runs/NAME) whose MLflow writes were spooled"),
         debug: bool = DebugOpt):
    """Send what a run spooled while the MLflow server was unreachable (metrics, tags, params,
    artifacts, its final status), and complete a registration that could not happen."""
    def go():
        from hindsight.errors import ConfigError
        from hindsight.state.runlock import run_lock
        from tasks.spool import Spool
        from tasks.tracking import sync_spool

        spool = Spool(run_dir)
        if not run_dir.is_dir():
            raise ConfigError(f"{run_dir}: no such run directory")
        pending = spool.pending()
        if not pending:
            typer.echo(f"{run_dir}: nothing spooled, MLflow has everything")
            return
        with run_lock(run_dir):
            sent = sync_spool(run_dir)
        registered = [f"{op['model_name']} v{spool.registered_version(op['run_id'])}" for op in pending
                      if op["op"] == "register"]
        typer.echo(f"{run_dir}: sent {sent} spooled tracking write(s) to {pending[0]['uri']}"
                   + (f"; registered {', '.join(registered)}" if registered else ""))

    _env()
    _guard(go, debug)


@data_app.command("build")
def data_build(out: Path = typer.Option(Path("data"), "--out", help="output folder"),
               seed: int = typer.Option(0, help="seed; 0 reproduces the md5 pinned in data.dvc"),
               check: Optional[Path] = typer.Option(Path("data.dvc"), help="compare with this .dvc pin")):
    """Regenerate the demo data deterministically."""
    from hindsight.data.rows import dvc_dir_md5, pinned_md5
    from hindsight.data.demo import build_demo_data

    build_demo_data(out, seed=seed)
    md5 = dvc_dir_md5(out)
    typer.echo(f"wrote {out} (md5 {md5})")
    if check and check.is_file():
        pinned = pinned_md5(check)
        if pinned != md5:
            typer.secho(f"error: md5 differs from {check} ({pinned})", fg="red", err=True)
            raise typer.Exit(1)
        typer.echo(f"matches {check}")


def main():
    try:
        app()
        code = 0
    except SystemExit as exc:
        code = exc.code
    _exit(code)


def _exit(code) -> None:
    """End the command without the interpreter's teardown, which took ~1.4 s after a pipeline
    (freeing torch's, Prefect's and MLflow's half a million objects one by one): a fifth of a
    cached rerun. What a normal exit does that matters is done first, in its order: threads
    that are not daemons finish (the metric writer drains its queue), then the atexit handlers
    (runs left open are ended, Prefect sends its queued logs and events, logging flushes)."""
    import atexit
    import threading

    if isinstance(code, str):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    threading._shutdown()  # what Py_Finalize calls first: joins non-daemon threads, runs their exit hooks
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
