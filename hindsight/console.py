"""One console (stderr) for what a person reads: the progress bar and the log lines print
through the same rich Console, so in a terminal the bar stays one bar under the lines (rich redraws it),
and through a pipe both are plain lines in order.

Stages report through the `hindsight` logger (`say`), never `print`: under the CLI its
handler writes to this console; in a deployment Prefect ships it to the flow run's logs
(`PREFECT_LOGGING_EXTRA_LOGGERS=hindsight`).
"""
from __future__ import annotations

import logging
from functools import lru_cache

log = logging.getLogger("hindsight")


@lru_cache(maxsize=1)
def console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)  # stdout keeps the results (the summary)


def say(message: str) -> None:
    log.info(message)


class ConsoleHandler(logging.Handler):
    """Each record as one plain line through the shared console (never wrapped: a line stays
    greppable in a pipe); a warning or an error says so."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if record.levelno == logging.WARNING:
                text = f"warning: {text}"
            elif record.levelno >= logging.ERROR:
                text = f"error: {text}"
            console().print(text, markup=False, highlight=False, soft_wrap=True)
        except Exception:
            self.handleError(record)


def route_logs_to_console(level: int = logging.INFO) -> None:
    """The `hindsight` logger prints through the console (CLI use), not through Prefect's handler."""
    if not any(isinstance(h, ConsoleHandler) for h in log.handlers):
        log.addHandler(ConsoleHandler())
    log.setLevel(level)
    log.propagate = False
