"""The CLI's runtime, apart from its commands: the environment a command runs in, the one console
its logs print through, one error line for a user error, and the process's fast exit."""
from __future__ import annotations

import logging
import os
import sys

import typer

from hindsight.errors import HindsightError


def env() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' load/save bars would break ours
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # and so would MLflow's
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # and TRL's dataset preparation's
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # its links open the GenAI view: ours say where
    # OpenMP's idle threads spin ~300,000 rounds before they sleep: on a shared machine that spinning
    # doubled a step's CPU (bench/threads.py). Sleep at once where the CPUs are already busy, spin
    # 10,000 rounds where they are not (cpus.omp_wait_env). Read when torch loads, so set here,
    # before any stage imports it; the processes a stage starts inherit it. The user's setting wins.
    if not {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} & set(os.environ):
        from hindsight.cpus import omp_wait_env

        os.environ.update(omp_wait_env())
    import warnings

    # TRL 1.16's own configs set the argument transformers 5 renamed: not the user's to fix
    warnings.filterwarnings("ignore", message=".*`gradient_checkpointing` is deprecated", category=FutureWarning)


def no_heartbeats():
    """Flow-run heartbeats exist for the zombie-run automation of a deployment (docs/deploy.md);
    under the CLI they only cost each flow's exit a wait of up to a second for the heartbeat
    thread. Off here unless the user sets a frequency."""
    from contextlib import nullcontext

    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    if os.environ.get("PREFECT_FLOWS_HEARTBEAT_FREQUENCY") or os.environ.get("PREFECT_RUNNER_HEARTBEAT_FREQUENCY"):
        return nullcontext()
    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def prefect_api() -> None:
    """Every flow talks to one long-lived Prefect server (cli/server.py), never a temporary one."""
    from cli.server import ensure_api

    ensure_api(lambda msg: typer.echo(msg, err=True))


def user_error_names() -> tuple[str, ...]:
    todo, names = [HindsightError], set()
    while todo:
        cls = todo.pop()
        names.add(f"{cls.__name__}: ")
        todo += cls.__subclasses__()
    return tuple(names)


class ForPeople(logging.Filter):
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
        return not any(name in msg for name in user_error_names())


def quiet_logs() -> None:
    """Logs a person reads, through one console: hindsight's own lines, and Prefect's with
    their noise filtered, print through the console the progress bar uses."""
    from hindsight.console import console, route_logs_to_console

    route_logs_to_console()
    for name in ("mlflow", "alembic"):  # "creating initial database tables": not news to a person
        logging.getLogger(name).setLevel(logging.WARNING)
    loggers = [logging.getLogger()] + [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)
                                       if n.startswith("prefect")]
    for handler in {h for lg in loggers for h in lg.handlers}:
        handler.addFilter(ForPeople())
        if hasattr(handler, "console"):  # Prefect's console handler: one console, so the bar stays whole
            handler.console = console()


def guard(fn, debug: bool):
    """One clear line and exit 1 for a user error; a traceback only with --debug."""
    try:
        return fn()
    except HindsightError as exc:
        if debug:
            raise
        from hindsight.errors import AlertStop, Preempted

        if isinstance(exc, Preempted):  # 128 + the signal, as a process killed by it would exit
            typer.secho(f"preempted: {exc}", fg="yellow", err=True)
            raise typer.Exit(128 + exc.signum) from None
        stopped = isinstance(exc, AlertStop)
        typer.secho(f"{'stopped' if stopped else 'error'}: {exc}", fg="yellow" if stopped else "red", err=True)
        raise typer.Exit(3 if stopped else 1) from None


def exit_now(code) -> None:
    """End the command without the interpreter's teardown, which took ~1.4 s after a pipeline
    (freeing torch's, Prefect's and MLflow's half a million objects one by one): a fifth of a
    cached rerun. What a normal exit does that matters is done first, in its order (`_finalize`)."""
    if isinstance(code, str):  # sys.exit("message"): printed, status 1
        print(code, file=sys.stderr)
        code = 1
    _finalize()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def _finalize() -> None:
    """What Py_Finalize does first, without the rest: threads that are not daemons finish (the
    metric writer drains its queue), then the atexit handlers (runs left open are ended, Prefect
    sends its queued logs and events, logging flushes). Python has no public call for either;
    these two private ones are what the interpreter itself calls, and a test
    (tests/unit/test_cli_exit.py) fails if a Python version drops them."""
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
