"""Progress for long stages: a rich bar on a terminal, one plain line per step otherwise (CI, logs)."""
from __future__ import annotations

import os
import sys
import threading
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
    """Progress of long work that is not an RL step: an evaluation's batches, the auto budget's
    probes, a sweep's trials (`total` counted in `unit`), or work that cannot be counted, such as
    a model's load or a GGUF's de-quantization inside transformers (`total` None).

    Quick work prints nothing. Once it has taken `every_s`: through a pipe, a line at most every
    `every_s` through the shared console; on a terminal, a bar (a spinner when uncounted) under
    the step's bar, erased when the work ends. Used as a context manager, it also beats while
    `update` is not called (one long batch), so a run never looks hung."""

    def __init__(self, label: str, total: int | None, unit: str = "", every_s: float = 5.0,
                 fancy: bool | None = None):
        self.label, self.total, self.unit, self.every_s = label, total, unit, every_s
        self.t0 = self.last = time.perf_counter()
        self.fancy = interactive() if fancy is None else fancy
        self.done, self._bar, self._task = 0, None, None
        self._lock, self._stop, self._beat = threading.Lock(), threading.Event(), None

    def update(self, done: int) -> None:
        with self._lock:
            self.done = done
            if self._bar is not None:
                self._bar.update(self._task, completed=done)
            elif time.perf_counter() - self.last >= self.every_s:
                self._show()

    def _show(self) -> None:
        """The first sign of slow work (a bar on a terminal) or the next line (under `_lock`)."""
        now = time.perf_counter()
        self.last = now
        if self.fancy:
            self._bar, self._task = _transient_bar(self.label, self.total, self.done)
            return
        from hindsight.console import console

        if self.total is None:
            text = f"{self.label}: still working ({now - self.t0:.0f}s)"
        else:
            rate = (now - self.t0) / max(1, self.done)
            eta = f", eta {rate * (self.total - self.done):.0f}s" if self.done else ""
            text = f"{self.label}: {self.done}/{self.total} {self.unit} ({now - self.t0:.0f}s{eta})"
        console().print(text, markup=False, highlight=False, soft_wrap=True)

    def __enter__(self) -> "Ticker":
        def beat() -> None:
            while not self._stop.wait(self.every_s / 2):
                with self._lock:
                    if self._bar is None and time.perf_counter() - self.last >= self.every_s:
                        self._show()

        self._beat = threading.Thread(target=beat, name="hindsight-progress", daemon=True)
        self._beat.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        self.close()

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.stop()
                self._bar = None


def working(label: str, every_s: float = 10.0) -> Ticker:
    """`with working("loading model ..."):` for work that cannot be counted (see `Ticker`)."""
    return Ticker(label, None, every_s=every_s)


def _transient_bar(label: str, total: int | None, done: int = 0):
    """A rich bar (a spinner when `total` is None) on the shared console, erased when stopped;
    rich stacks it under a live step bar."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from hindsight.console import console

    columns = [SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()] if total is None else \
        [TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn()]
    bar = Progress(*columns, console=console(), transient=True)
    task = bar.add_task(label, total=total, completed=done)
    bar.start()
    return bar, task
