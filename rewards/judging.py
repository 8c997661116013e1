"""Judging a program by its tests, each in a sandbox of its own (`rewards/harness.py`).

    program sandbox  <- JSON lines ->  host (this module)  <- JSON lines ->  tests sandbox

The program's sandbox runs the model's program and serves calls to its functions; the tests'
sandbox runs the dataset's tests (and the prompt's own helpers), with the program's names bound
to proxies. The host starts both, hands the tests' sandbox the names the program defined, and
relays calls and answers between them line by line. It never evaluates anything either side
sends: it reads each line's envelope (JSON, at most `sandbox.LINE_CAP` bytes) and forwards its
bytes. So nothing a program returns runs on the host, whatever a test does with it (a test that
`eval`s a returned string runs it in the tests' sandbox), and what the host pays for a program is
bounded by the line cap and one deadline for the pair. Only the tests' sandbox gives a verdict.
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from rewards.sandbox import Limits, Sandbox

_FROM_TESTS = ("call", "answer")    # what the tests' side may say to the program's
_FROM_PROGRAM = ("call", "answer")  # and back: answers, and calls to the tests' callbacks


@dataclass(frozen=True)
class Verdict:
    passed: bool
    why: str                  # "passed", or why not: "program failed to start", "tests failed", "timed out", ...
    timed_out: bool = False
    truncated: bool = False


def judge(program: str, tests: str, helpers: str = "", limits: Limits | None = None, mode: str = "bwrap") -> Verdict:
    """Run `program` and its `tests` in two sandboxes under one deadline; the tests' verdict."""
    limits = limits or Limits()
    deadline = time.monotonic() + limits.timeout_s
    token = secrets.token_hex(8)  # the mark of a callable's handle in a value, unguessable by the program
    with Sandbox("program", {"program": program, "token": token}, limits, mode, deadline=deadline) as prog:
        first = prog.next_message()
        if first is None or first[0].get("op") != "started" or first[0].get("ok") is not True:
            return _ended(prog, None, "the program did not start (it raised, exited or ran out of time)")
        names = first[0].get("names")
        if not isinstance(names, dict):
            return _ended(prog, None, "the program's names were not a mapping")
        request = {"tests": tests, "helpers": helpers, "names": names, "token": token}
        with Sandbox("tests", request, limits, mode, checked=True, deadline=deadline) as tst:
            return _relay(prog, tst)


def _relay(prog: Sandbox, tst: Sandbox) -> Verdict:
    """Forward calls and answers both ways until the tests' side gives its verdict."""
    program_gone = False
    while True:
        moved = False
        for src, dst, allowed in ((tst, prog, _FROM_TESTS), (prog, tst, _FROM_PROGRAM)):
            for msg, line in src.drain():
                if src is tst and msg.get("op") == "verdict":
                    passed = msg.get("passed") is True and not prog.over
                    return Verdict(passed, "passed" if passed else "the tests failed", prog.timed_out,
                                   prog.truncated or prog.overflowed)
                if msg.get("op") in allowed and not (dst is prog and program_gone):
                    dst.send(line)
                    moved = True
        if not tst.pump(0.0 if moved else 0.05):
            return _ended(prog, tst, "the tests' sandbox ended without a verdict")
        if not program_gone and not prog.pump(0.0):
            program_gone = True  # it exited, flooded or ran out of time: its pending answers never come
            tst.end_input()


def _ended(prog: Sandbox, tst: Sandbox | None, why: str) -> Verdict:
    boxes = [b for b in (prog, tst) if b is not None]
    timed_out = any(b.timed_out for b in boxes)
    return Verdict(False, "timed out" if timed_out else why, timed_out,
                   any(b.truncated or b.overflowed for b in boxes))
