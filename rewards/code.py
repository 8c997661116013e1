"""Reward for model-written Python: 1.0 when its code passes the row's tests, run sandboxed.

Only the candidate's code runs in the sandbox. The row's tests are the dataset's, trusted, and
run here, outside it: every name the program defines is a proxy (`Remote`) whose call sends
its arguments in as literals, has the program's function run in the sandbox, and gets its
return value back as a literal of exactly the built-in types, which `ast.literal_eval` turns
into a value here. So any test form judges the program on plain data only: `assert f(x) ==
2 + 3`, `math.isclose`, `and` chains, `5 in f()`, `abs(f(x) - 5) < 1e-9`, or HumanEval's
`check(candidate)` (with an `entry_point` column, `check(<entry_point>)` is called, as
HumanEval's harness does).

Nothing the program does can forge a pass: exiting early, printing a marker, writing answer
lines (each call carries a fresh random id), patching builtins (they are the sandbox's own),
or returning an always-equal object or an int subclass that lies in its repr (not plain data:
the call fails). What cannot be judged this way (a method of a class instance, a test that
passes a function or reads a mutated argument) fails and scores 0; it is never trusted.
"""
from __future__ import annotations

import ast
import builtins
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from rewards import completion_text
from rewards.harness import encode
from rewards import cgroup
from rewards.sandbox import MEMORY_SCOPES, MODES, Limits, SandboxUnavailable, Session, isolation_problem

log = logging.getLogger("rewards.code")
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
MAX_LITERAL = 1_000_000  # characters of one value coming out of the sandbox


def extract_code(text: str) -> str:
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


class CandidateError(Exception):
    """A call into the sandbox that gave no plain-data value (it raised, returned an object, or
    the session ended). The test that made it fails, as an assert would."""


class Remote:
    """One of the program's functions, called from the trusted tests: plain data in, plain data out."""

    def __init__(self, session: Session, name: str):
        self._session, self._name = session, name

    def __call__(self, *args, **kwargs):
        literal_args, literal_kwargs = encode(list(args)), encode(kwargs)
        if literal_args is None or literal_kwargs is None:
            raise CandidateError(f"{self._name}: an argument is not plain data, so it cannot be sent in")
        answer = self._session.call(self._name, literal_args, literal_kwargs)
        return decode(answer, self._name)

    def __repr__(self) -> str:
        return f"<candidate {self._name}>"


def decode(answer: dict, name: str):
    value = answer.get("value")
    if not isinstance(value, str) or len(value) > MAX_LITERAL:
        raise CandidateError(f"{name}: {answer.get('error', 'no value')}")
    try:
        return ast.literal_eval(value)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise CandidateError(f"{name}: its answer is not a literal") from None


def with_entry_point(tests: str, entry_point: str | None = None) -> str:
    """The row's tests, and for HumanEval-style tests (`def check(candidate)`) the call to it."""
    if entry_point and re.search(r"^def check\(", tests, re.MULTILINE) and not re.search(
            r"^check\(", tests, re.MULTILINE):
        return f"{tests}\ncheck({entry_point})\n"
    return tests


def judge_tests(tests: str, names: dict, session: Session) -> bool:
    """Run the trusted tests here against the program's names; True when nothing raised."""
    scope = {"__builtins__": builtins, "__name__": "__tests__"}
    for name, kind in names.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("__") or hasattr(builtins, name):
            continue  # a program's `abs` or `isclose`-like builtin would judge the tests' own checks
        if kind == "callable":
            scope[name] = Remote(session, name)
        elif isinstance(kind, str) and len(kind) <= MAX_LITERAL:
            try:
                scope[name] = ast.literal_eval(kind)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
    try:
        exec(compile(tests, "<tests>", "exec"), scope)
    except CandidateError as exc:
        log.debug("code reward: %s", exc)
        return False
    except Exception:  # an assert that failed, or the test's own error on the candidate's values
        return False
    return True


def preflight(sandbox: str = "bwrap", memory_scope: str = "tree", **_) -> None:
    """Called before a run starts: refuse untrusted code where the isolation cannot be had."""
    if sandbox not in MODES:
        raise ValueError(f"sandbox: {sandbox!r} is not one of {', '.join(MODES)}")
    if memory_scope not in MEMORY_SCOPES:
        raise ValueError(f"memory_scope: {memory_scope!r} is not one of {', '.join(MEMORY_SCOPES)}")
    if sandbox == "bwrap" and (problem := isolation_problem()):
        raise SandboxUnavailable(f"{problem}; the code reward will not run model-written code without isolation "
                                 f"(set `args: {{sandbox: unsafe-local}}` on the reward to run it anyway)")
    if sandbox == "bwrap" and memory_scope == "tree" and (problem := cgroup.problem()):
        raise SandboxUnavailable(f"{problem}; set `args: {{memory_scope: process}}` on the reward to bound each "
                                 f"process alone (processes x memory_mb in all)")
    if sandbox == "unsafe-local":
        _warn_unsafe()


@lru_cache(maxsize=1)
def _warn_unsafe() -> None:
    log.warning("code reward: sandbox unsafe-local runs model-written code without filesystem, process, "
                "user or network isolation")


def code_tests(completions, tests, entry_point=None, timeout_s: float = 10.0, cpu_s: int = 5, memory_mb: int = 512,
               sandbox: str = "bwrap", parallel: int = 4, processes: int = 32, output_bytes: int = 1 << 20,
               memory_scope: str = "tree", tmp_mb: int = 64, **_) -> list[float]:
    """`tests` (one per completion) are the row's Python tests, run here against the completion's
    program in its own sandbox (its own timeout), `parallel` at a time; `entry_point` (a column,
    optional) names the function HumanEval-style `check(candidate)` tests are called with."""
    preflight(sandbox, memory_scope)
    limits = Limits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, processes=processes,
                    output_bytes=output_bytes, memory_scope=memory_scope, tmp_mb=tmp_mb)
    points = entry_point if isinstance(entry_point, list) else [entry_point] * len(completions)

    def one(item) -> float:
        completion, test, point = item
        program = with_entry_point(str(test), point)
        with Session(extract_code(completion_text(completion)), limits, sandbox) as session:
            names = session.started()
            passed = names is not None and judge_tests(program, names, session)
        result = session.result
        return 1.0 if passed and not result.timed_out and not result.output_truncated else 0.0

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(one, zip(completions, tests, points)))


code_tests.preflight = preflight
