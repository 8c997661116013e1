"""The `hindsight` command: its commands (`cli.commands`) and its runtime (`cli.runtime`)."""
from __future__ import annotations


def main():
    from cli.commands import build_app
    from cli.runtime import exit_now

    try:
        build_app()()
        code = 0
    except SystemExit as exc:
        code = exc.code
    exit_now(code)
