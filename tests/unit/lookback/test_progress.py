"""Progress is plain lines off a terminal (CI, logs) and a rich bar on one."""
import io

from rich.console import Console

from hindsight import progress
from hindsight.progress import StepProgress


def test_plain_lines_in_ci(monkeypatch, capsys):
    monkeypatch.setenv("CI", "true")
    assert progress.interactive() is False
    p = StepProgress("rl", total=4, start=1)
    p.advance(2, "reward 0.500")
    p.close()
    line = capsys.readouterr().err.strip()  # progress and logs share the console on stderr; stdout is results
    assert line.startswith("rl step 2/4 reward 0.500 eta ") and line.endswith("s")


def test_rich_bar_on_a_terminal(monkeypatch):
    buf = io.StringIO()
    p = StepProgress("rl", total=4, fancy=True, console=Console(file=buf, force_terminal=True, width=100))
    p.advance(3, "reward 0.750")
    p.close()
    assert "3/4" in buf.getvalue() and "reward 0.750" in buf.getvalue()


def test_a_ticker_prints_only_when_work_is_slow(monkeypatch):
    import hindsight.progress as progress

    lines, clock = [], [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])

    class Console:
        def print(self, text, **kw):
            lines.append(text)

    monkeypatch.setattr("hindsight.console.console", lambda: Console())
    ticker = progress.Ticker("eval", 200, "answered", every_s=5.0)
    clock[0] = 1.0
    ticker.update(64)  # quick: nothing
    clock[0] = 12.0
    ticker.update(128)
    clock[0] = 13.0
    ticker.update(192)  # within 5 s of the last line: nothing
    assert lines == ["eval: 128/200 answered (12s, eta 7s)"]


def test_a_ticker_beats_while_one_long_batch_runs(monkeypatch):
    """SmolLM2's 8 eval prompts are one batch of 8 minutes: the beat says the run is alive meanwhile."""
    import threading

    import hindsight.progress as progress

    lines, printed = [], threading.Event()

    class Console:
        def print(self, text, **kw):
            lines.append(text)
            printed.set()

    monkeypatch.setattr("hindsight.console.console", lambda: Console())
    with progress.Ticker("eval", 8, "answered", every_s=0.2, fancy=False):
        assert printed.wait(10)  # no update came: the beat printed
    assert lines[0].startswith("eval: 0/8 answered (") and "eta" not in lines[0]
    lines.clear()
    with progress.working("loading model from /m", every_s=0.2):
        printed.clear()
        assert printed.wait(10)
    assert lines[0].startswith("loading model from /m: still working (")


def test_quick_work_prints_nothing_and_a_terminal_gets_a_bar_that_goes_away(monkeypatch):
    import io

    import hindsight.progress as progress

    buf = io.StringIO()
    monkeypatch.setattr("hindsight.console.console", lambda: Console(file=buf, force_terminal=True, width=100))
    with progress.Ticker("eval", 8, "answered", every_s=60.0, fancy=False) as t:
        t.update(8)
    assert buf.getvalue() == ""  # quick: nothing at all
    clock = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    t = progress.Ticker("auto budget", 4, "probes", every_s=5.0, fancy=True)
    clock[0] = 6.0
    t.update(2)
    assert t._bar is not None
    t.update(3)
    t.close()
    assert "auto budget" in buf.getvalue() and t._bar is None
