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
