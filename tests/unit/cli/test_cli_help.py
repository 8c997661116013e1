"""`--help` shows a flag as a flag, not as an option taking a `<bool>`."""
from typer.testing import CliRunner

from cli.commands import build_app


def test_flags_are_shown_without_a_value():
    out = CliRunner().invoke(build_app(), ["run", "rl", "--help"], env={"COLUMNS": "160"}).output
    for flag in ("--force", "--debug", "--smoke"):
        line = next(ln for ln in out.splitlines() if f" {flag} " in ln)
        assert "<bool>" not in line, line
    assert "KEY=VALUE" in out and "PATH" in out
    assert "--force-new-run" not in out  # the old spelling of --force: still taken, not offered
