"""Reward for model-written Python: 1.0 when its code passes the row's tests, run sandboxed.

The verdict is reached outside the sandbox. Each test statement is split by the judge:
- `assert EXPR == LITERAL` (and `!=`, `<`, `<=`, `>`, `>=`, `in`, `not in`, either side
  literal), `assert EXPR` and `assert not EXPR`: only EXPR is sent in; the sandbox answers
  its value as a literal of exactly the built-in types, and the judge compares it here with
  the expected value, which never enters the sandbox;
- any other statement (imports, helper definitions, `check(candidate)`) runs in the sandbox,
  which answers whether it raised.

So exiting early (`sys.exit(0)`, `os._exit(0)`), printing a marker, patching builtins or
returning an object whose `__eq__` is always true all score 0: the exit status and the
output are not read, and a value the judge cannot decode is not equal to anything. Only the
second kind of statement, and `assert EXPR` on a value that is not plain data, is answered
by the sandbox itself, so a program that forges the harness's answer line could pass those.
"""
from __future__ import annotations

import ast
import logging
import operator
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

from rewards import completion_text
from rewards.sandbox import MODES, Limits, SandboxUnavailable, isolation_problem, run_python

log = logging.getLogger("rewards.code")
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
_OPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
        ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_FLIPPED = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE, ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}


def extract_code(text: str) -> str:
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


@dataclass(frozen=True)
class Check:
    """One test statement: what runs in the sandbox, and how its answer is judged here."""
    kind: str                 # "exec" (must not raise) or "eval" (its value is judged)
    source: str
    compare: type | None = None   # an ast operator class, with `expected` on its right
    expected: object = None
    negate: bool = False      # `assert not EXPR`


def plan_tests(tests: str) -> list[Check]:
    """The row's tests as checks (a SyntaxError is the dataset's bug, and raises)."""
    return [_check(node) for node in ast.parse(tests).body]


def _literal(node):
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _check(node: ast.stmt) -> Check:
    if not isinstance(node, ast.Assert):
        return Check("exec", ast.unparse(node))
    test = node.test
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return Check("eval", ast.unparse(test.operand), negate=True)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _OPS:
        op, left, right = type(test.ops[0]), test.left, test.comparators[0]
        ok, expected = _literal(right)
        if ok:
            return Check("eval", ast.unparse(left), op, expected)
        ok, expected = _literal(left)
        if ok and op in _FLIPPED:
            return Check("eval", ast.unparse(right), _FLIPPED[op], expected)
    return Check("eval", ast.unparse(test))


def verdict(checks: list[Check], answers: list[dict]) -> bool:
    """True when the program ran and every check was answered and holds."""
    got = {a["i"]: a for a in answers}  # a repeated index: the last answer counts
    if not got.get(-1, {}).get("ok"):
        return False
    return all(_holds(c, got.get(i)) for i, c in enumerate(checks))


def _holds(check: Check, answer: dict | None) -> bool:
    if not answer or "error" in answer:
        return False
    if check.kind == "exec":
        return answer.get("ok") is True
    if "value" in answer and isinstance(answer["value"], str):
        ok, value = _literal_text(answer["value"])
        if not ok:
            return False
    elif check.compare is None and type(answer.get("truth")) is bool:
        value = answer["truth"]  # not plain data: its truth as the sandbox reported it
    else:
        return False
    try:
        result = bool(_OPS[check.compare](value, check.expected)) if check.compare else bool(value)
    except Exception:  # e.g. `<` between a str and an int: the assert would have raised
        return False
    return result != check.negate


def _literal_text(text: str):
    if len(text) > 1_000_000:
        return False, None
    try:
        return True, ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def preflight(sandbox: str = "bwrap", **_) -> None:
    """Called before a run starts: refuse untrusted code where the isolation cannot be had."""
    if sandbox not in MODES:
        raise ValueError(f"sandbox: {sandbox!r} is not one of {', '.join(MODES)}")
    if sandbox == "bwrap" and (problem := isolation_problem()):
        raise SandboxUnavailable(f"{problem}; the code reward will not run model-written code without isolation "
                                 f"(set `args: {{sandbox: unsafe-local}}` on the reward to run it anyway)")
    if sandbox == "unsafe-local":
        _warn_unsafe()


@lru_cache(maxsize=1)
def _warn_unsafe() -> None:
    log.warning("code reward: sandbox unsafe-local runs model-written code without filesystem, process, "
                "user or network isolation")


def code_tests(completions, tests, timeout_s: float = 10.0, cpu_s: int = 5, memory_mb: int = 512,
               sandbox: str = "bwrap", parallel: int = 4, processes: int = 32, output_bytes: int = 1 << 20,
               **_) -> list[float]:
    """`tests` (one per completion) are Python statements, typically asserts; each completion
    runs in its own sandbox with its own timeout, `parallel` at a time."""
    preflight(sandbox)
    limits = Limits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, processes=processes,
                    output_bytes=output_bytes)

    def one(pair) -> float:
        completion, test = pair
        checks = plan_tests(str(test))
        result = run_python(extract_code(completion_text(completion)), limits, sandbox,
                            [(c.kind, c.source) for c in checks])
        return 1.0 if verdict(checks, result.answers) and not result.timed_out and not result.output_truncated else 0.0

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(one, zip(completions, tests)))


code_tests.preflight = preflight
