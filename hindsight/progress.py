"""Progress for long stages: a rich bar on a terminal, one plain line per step otherwise (CI, logs)."""
from __future__ import annotations

import os
import sys
import time


def interactive() -> bool:
    return sys.stdout.isatty() and not os.environ.get("CI") and os.environ.get("TERM") != "dumb"


class StepProgress:
    def __init__(self, label: str, total: int, start: int = 0, fancy: bool | None = None, console=None):
        self.label, self.total, self.start = label, total, start
        self.t0 = time.perf_counter()
        self.fancy = interactive() if fancy is None else fancy
        self._bar = None
        if self.fancy:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            from hindsight.console import console as shared

            # the shared console: log lines printed meanwhile go above the bar, which rich redraws once
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                 TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console or shared())
            self._task = self._bar.add_task(label, total=total, completed=start, info="")
            self._bar.start()

    def eta_s(self, done: int) -> float:
        rate = (time.perf_counter() - self.t0) / max(1, done - self.start)
        return rate * (self.total - done)

    def advance(self, done: int, info: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, info=info)
        else:
            from hindsight.console import console

            console().print(f"{self.label} step {done}/{self.total} {info} eta {self.eta_s(done):.0f}s", markup=False,
                            highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class Ticker:
    """Progress of long work that is not an RL step (an evaluation's batches, a sweep's trials): a
    line at most every `every_s` seconds, through the shared console, so a terminal's step bar
    stays one bar under it and a pipe shows that the run is alive. Quick work prints nothing."""

    def __init__(self, label: str, total: int, unit: str, every_s: float = 5.0):
        self.label, self.total, self.unit, self.every_s = label, total, unit, every_s
        self.t0 = self.last = time.perf_counter()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.last < self.every_s:
            return
        self.last = now
        from hindsight.console import console

        rate = (now - self.t0) / max(1, done)
        console().print(f"{self.label}: {done}/{self.total} {self.unit} ({now - self.t0:.0f}s, eta "
                        f"{rate * (self.total - done):.0f}s)", markup=False, highlight=False, soft_wrap=True)
