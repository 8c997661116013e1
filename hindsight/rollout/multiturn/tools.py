"""Tools a policy can call, in TRL's contract: a plain function with type hints and a docstring
(its JSON schema comes from transformers' `get_json_schema`, the one `apply_chat_template(tools=)`
renders), or a public method of an `environment_factory` instance.

A call never fails the step. A tool that raises, runs past its timeout, gets arguments it does
not take, or is not a tool at all, answers with an error text the model reads in its next turn;
the error is counted. Where a tool runs is its `isolation`:
- `sandbox` (the default for functions): each call runs in the code reward's bubblewrap
  sandbox (`rewards.sandbox`) with its limits: the function's module source and the call go
  in, the result's text comes out; a hung call is killed at its timeout;
- `in_process`: called in the rollout worker's process, as TRL does. A call past its timeout
  is answered with an error turn; its thread cannot be killed, so it is a daemon thread that
  holds no exit, and the call is recorded as abandoned (`ABANDONED`, and a log line): an
  explicit choice for trusted tools and for stateful environments.

Before any call its arguments are checked against the function's names, type hints and size
bounds (`arguments`). A turn may make at most `max_calls` calls (the rest are answered with an
error); its sandboxed calls run `at_once` at a time, its in-process ones in order (they share state).
"""
from __future__ import annotations

import concurrent.futures as cf
import inspect
import logging
import threading
import time
from dataclasses import dataclass, field

from hindsight.errors import ConfigError
from hindsight.rollout.multiturn.arguments import DEFAULT_LIMITS, Limits, problem

log = logging.getLogger("hindsight")
ABANDONED = {"calls": 0}  # in-process calls left running past their timeout, in this process

RESULT_CHARS = 4000  # what a tool's answer may add to the context; the rest is cut (and said)


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: its name and arguments, or why it could not be read."""
    name: str
    arguments: dict = field(default_factory=dict)
    error: str | None = None  # malformed JSON, no name, arguments not an object


@dataclass(frozen=True)
class ToolResult:
    name: str
    arguments: dict
    content: str
    error: bool
    seconds: float


def tool_schema(fn, where: str) -> dict:
    """The function's JSON schema, as the chat template renders it; a function without type
    hints or a docstring (what `get_json_schema` needs) is a config error naming it."""
    from transformers.utils import get_json_schema  # transformers: a tool config needs it anyway

    try:
        return get_json_schema(fn)
    except Exception as exc:  # transformers' DocstringParsingException / TypeHintParsingException
        raise ConfigError(f"{where}: tool {getattr(fn, '__name__', fn)!r} cannot be offered to the model: {exc} "
                          f"(a tool needs type hints on every argument and a docstring with an Args section, "
                          f"as TRL's tools do)") from None


class Tool:
    """A function offered to the model under its own name."""

    def __init__(self, fn, where: str, isolation: str = "in_process", timeout_s: float = 10.0, sandbox=None,
                 limits: Limits = DEFAULT_LIMITS):
        self.fn, self.isolation, self.timeout_s, self.sandbox, self.limits = fn, isolation, timeout_s, sandbox, limits
        self.schema = tool_schema(fn, where)
        self.name = self.schema["function"]["name"]
        self.params = set(self.schema["function"]["parameters"].get("properties", {}))
        self.required = set(self.schema["function"]["parameters"].get("required", []))

    def check_arguments(self, args: dict) -> str | None:
        unknown, missing = sorted(set(args) - self.params), sorted(self.required - set(args))
        if unknown or missing:
            return (f"{self.name}() " + "; ".join(
                ([f"takes no argument {', '.join(unknown)}"] if unknown else []) +
                ([f"is missing {', '.join(missing)}"] if missing else [])))
        return problem(self.fn, self.name, args, self.limits)

    def run(self, args: dict) -> str:
        """The result's text; raises on the tool's own failure (turned into an error turn)."""
        if self.isolation == "sandbox":
            return self.sandbox.call(self.fn, args, self.timeout_s)
        return _in_thread(self.fn, args, self.timeout_s)


def _in_thread(fn, args: dict, timeout_s: float) -> str:
    return str(within(fn, timeout_s, **args))


def within(fn, timeout_s: float, *args, **kwargs):
    """fn(*args, **kwargs) in a daemon thread: its value, its exception (anything it raises, even
    SystemExit, as an Exception), or TimeoutError. A call past its timeout is abandoned: its thread
    cannot be killed, but as a daemon it never holds the process's exit."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except Exception as exc:
            box["error"] = exc
        except BaseException as exc:  # SystemExit, KeyboardInterrupt raised by the tool: its failure
            box["error"] = RuntimeError(f"{type(exc).__name__}: {exc}")

    worker = threading.Thread(target=run, name=f"tool-{getattr(fn, '__name__', 'call')}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        ABANDONED["calls"] += 1
        log.warning("%s: no answer within %g s; the call is abandoned (%d so far in this process)",
                    getattr(fn, "__name__", fn), timeout_s, ABANDONED["calls"])
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def environment_tools(instance, where: str, timeout_s: float, limits: Limits = DEFAULT_LIMITS) -> list[Tool]:
    """The tool methods of an environment instance, as TRL finds them: the class's public
    functions other than `reset` and `get_reward`. They run in process (they share its state)."""
    names = [n for n, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
             if not n.startswith("_") and n not in ("reset", "get_reward")]
    return [Tool(getattr(instance, n), where, "in_process", timeout_s, limits=limits) for n in names]


class Toolbox:
    """The tools one trajectory may call, by name."""

    def __init__(self, tools: list[Tool], max_calls: int = 8, at_once: int = 4):
        self.tools = {t.name: t for t in tools}
        self.max_calls, self.at_once = max_calls, at_once

    def call_all(self, calls: list[ToolCall]) -> list[ToolResult]:
        """One turn's calls, answered in order: past `max_calls` an error each; the sandboxed
        ones `at_once` at a time, while the in-process ones run in order here (they share state)."""
        kept, over = calls[: self.max_calls], calls[self.max_calls:]
        apart = [i for i, c in enumerate(kept) if self._sandboxed(c)]
        results: dict[int, ToolResult] = {}
        pool = cf.ThreadPoolExecutor(max_workers=self.at_once) if len(apart) > 1 else None
        try:
            futures = {i: pool.submit(self.call, kept[i]) for i in apart} if pool else {}
            for i, c in enumerate(kept):
                if i not in futures:
                    results[i] = self.call(c)
            results.update({i: f.result() for i, f in futures.items()})
        finally:
            if pool is not None:
                pool.shutdown(wait=False)
        refused = [ToolResult(c.name, c.arguments, f"error: only {self.max_calls} calls a turn; this one was not run",
                              True, 0.0) for c in over]
        return [results[i] for i in range(len(kept))] + refused

    def _sandboxed(self, call: ToolCall) -> bool:
        tool = self.tools.get(call.name)
        return tool is not None and tool.isolation == "sandbox" and not call.error

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in self.tools.values()]

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call; every failure is the error text the model reads next."""
        t0 = time.perf_counter()
        content, error = self._answer(call)
        if len(content) > RESULT_CHARS:
            content = content[:RESULT_CHARS] + f"... [cut: {len(content) - RESULT_CHARS} more characters]"
        return ToolResult(call.name, call.arguments, content, error, time.perf_counter() - t0)

    def _answer(self, call: ToolCall) -> tuple[str, bool]:
        if call.error:
            return f"error: {call.error}", True
        tool = self.tools.get(call.name)
        if tool is None:
            return f"error: no tool named {call.name!r}; the tools are {', '.join(sorted(self.tools)) or 'none'}", True
        problem = tool.check_arguments(call.arguments)
        if problem:
            return f"error: {problem}", True
        try:
            return tool.run(call.arguments), False
        except Exception as exc:  # the tool's own failure: the model reads it, the step goes on
            shown = getattr(exc, "shown", None)  # a sandboxed program's own `Type: message`
            return f"error: {shown if isinstance(shown, str) else f'{type(exc).__name__}: {_said(exc)}'}", True


def _said(exc: BaseException) -> str:
    """An exception's message, even one whose __str__ raises."""
    try:
        return str(exc)
    except Exception:
        return "(its message cannot be read)"


