"""`python -m cli` in a process forked from one that has already imported what the CLI imports.

The error cases run ~100 CLI commands that each fail within a second of their own work, after
~3-5 s of importing Prefect, MLflow, torch and transformers. This server imports them once; each
command is then a child forked from it that runs `cli.__main__` as `python -m cli` would: its own
process, working directory, argv, environment, stdout and stderr, and exit status. What a fork
cannot give, a case that sets environment variables of its own (read by those libraries at
import), goes through a plain subprocess instead (`test_bad_input._hindsight`).

    python tests/errors/forkcli.py          # reads one JSON request a line on stdin

A request is {"args", "cwd", "env", "out", "err"}; the answer lines are {"pid"} once the child
runs, then {"rc"} when it ends (the exit status as `subprocess` reports it: -N for a signal).
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import traceback


def warm() -> None:
    """Import what a command imports, in the CLI's order (its environment defaults first); run
    nothing, so no cache or client of these libraries holds anything a child would inherit."""
    from cli.runtime import env

    env()
    import cli.commands  # noqa: F401
    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    import prefect  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from flows import registry

    for stage in registry.STAGES:  # every stage's flow, and through them tasks and tracking
        stage.load_flow()

    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:  # a fork keeps only this thread: a lock another one held would never be released
        sys.exit(f"forkcli: threads running after the imports, a fork would not be a clean process: {others}")


def child(req: dict) -> None:
    """In the forked process: become `python -m cli ARGS` started in req's folder and environment."""
    code = 1
    try:
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                                (2, req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
            new = os.open(path, flags, 0o644)
            os.dup2(new, fd)
            os.close(new)
        sys.path[0] = os.getcwd()  # as `python -m` puts the working folder first (a user's reward module)
        sys.argv = [os.path.join(os.path.dirname(__import__("cli").__file__), "__main__.py"), *req["args"]]
        runpy.run_module("cli", run_name="__main__", alter_sys=True)  # ends in os._exit (cli.runtime.exit_now)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    warm()
    answer = sys.stdout
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            child(req)
        answer.write(json.dumps({"pid": pid}) + "\n")
        answer.flush()
        _, status = os.waitpid(pid, 0)
        answer.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\n")
        answer.flush()


if __name__ == "__main__":
    # the repository (on PYTHONPATH too) instead of this folder: a child puts its working folder here
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    serve()
