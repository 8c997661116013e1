"""Reward for model-written Python: 1.0 when its code passes the row's tests.

The program and the tests each run in a sandbox of their own (`rewards/judging.py`), and only
plain data crosses between them: every name the program defines is a proxy in the tests'
sandbox whose call sends its arguments in as literals and gets the return value back as a
literal of exactly the built-in types, parsed there. So any test form judges the program on
plain data: `assert f(x) == 2 + 3`, `math.isclose`, `and` chains, `5 in f()`, HumanEval's
`check(candidate)` (with an `entry_point` column, `check(<entry_point>)` is called, as HumanEval's
harness does), and also what needs more than values:

- an exception crosses as its nearest built-in type with its message, so a test that expects
  `ValueError` (`try/except`, or `with raises(...)` of its own) judges it as raised;
- a generator or iterator comes back as an iterator over its items (at most 100,000);
- the modules the solution imported are the tests' too (`math` from its own `import math`);
- a test may pass a function (a lambda, a key): the program calls it back across the boundary;
  a function the program returns is a proxy the test can call;
- helpers the prompt defines (HumanEval/50's `encode_shift`) are the prompt's, run in the tests'
  sandbox, never the program's redefinition (`prompt_helpers`).

Nothing the program does can forge a pass: the verdict is the tests' sandbox's, which the
program cannot reach; exiting, printing markers, patching builtins or returning an always-equal
object (not plain data) all fail, and a value or a names line past its size limit, or a judging
past `timeout_s`, is a counted failure that costs the host nothing but its line buffers.
"""
from __future__ import annotations

import ast
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from rewards import cgroup, completion_text
from rewards.judging import judge
from rewards.sandbox import MEMORY_SCOPES, MODES, Limits, SandboxUnavailable, isolation_problem

log = logging.getLogger("rewards.code")
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    blocks = _FENCE.findall(text)
    return blocks[-1] if blocks else text


def with_entry_point(tests: str, entry_point: str | None = None) -> str:
    """The row's tests, and for HumanEval-style tests (`def check(candidate)`) the call to it."""
    if entry_point and re.search(r"^def check\(", tests, re.MULTILINE) and not re.search(
            r"^check\(", tests, re.MULTILINE):
        return f"{tests}\ncheck({entry_point})\n"
    return tests


def prompt_helpers(prompt, entry_point: str | None) -> str:
    """The definitions a prompt gives the program to build on (imports, helper functions and
    classes, constants), as source to run before the tests: a test that calls the prompt's
    helper then calls the prompt's, not the program's version of it. The function the program
    is asked to write (`entry_point`) and any stub (a body of only a docstring, `pass` or `...`)
    are left out. A prompt that is no Python (a chat turn) gives nothing."""
    text = _prompt_text(prompt)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ""
    keep = [node for node in tree.body if not _is_task(node, entry_point)]
    return ast.unparse(ast.Module(body=keep, type_ignores=[])) if keep else ""


def _prompt_text(prompt) -> str:
    if isinstance(prompt, list):  # a conversation: the user's turns
        return "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict) and m.get("role") == "user")
    return prompt if isinstance(prompt, str) else ""


def _is_task(node: ast.stmt, entry_point: str | None) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)):
        return False
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True  # an expression or statement the prompt runs: not a definition to keep
    if node.name == entry_point:
        return True
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                           and s.value.value is Ellipsis) for s in body)


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
    log.warning("code reward: sandbox unsafe-local runs model-written code and its tests without filesystem, "
                "process, user or network isolation")


def code_tests(completions, tests, entry_point=None, prompts=None, timeout_s: float = 10.0, cpu_s: int = 5,
               memory_mb: int = 512, sandbox: str = "bwrap", parallel: int = 4, processes: int = 32,
               output_bytes: int = 1 << 20, memory_scope: str = "tree", tmp_mb: int = 64,
               prompt_helpers_from: str | None = "prompts", **columns) -> list[float]:
    """`tests` (one per completion) are the row's Python tests, run against the completion's
    program, each pair in its own two sandboxes (one `timeout_s` for both), `parallel` at a time;
    `entry_point` (a column, optional) names the function HumanEval-style `check(candidate)` tests
    are called with. The prompt's helpers come from `prompts` (or the column named by
    `prompt_helpers_from`; None: none)."""
    preflight(sandbox, memory_scope)
    limits = Limits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, processes=processes,
                    output_bytes=output_bytes, memory_scope=memory_scope, tmp_mb=tmp_mb)
    n = len(completions)
    points = entry_point if isinstance(entry_point, list) else [entry_point] * n
    source = prompts if prompt_helpers_from == "prompts" else columns.get(prompt_helpers_from or "", None)
    sources = source if isinstance(source, list) and len(source) == n else [None] * n

    def one(item) -> float:
        completion, test, point, prompt = item
        verdict = judge(extract_code(completion_text(completion)), with_entry_point(str(test), point),
                        prompt_helpers(prompt, point) if prompt is not None else "", limits, sandbox)
        return 1.0 if verdict.passed else 0.0

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return list(pool.map(one, zip(completions, tests, points, sources)))


code_tests.preflight = preflight
