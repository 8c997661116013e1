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
