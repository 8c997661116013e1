"""Multi-turn tools that run in the code reward's bubblewrap sandbox (`rewards.sandbox`), one fresh
sandbox a call: a user's tool function (its module's source and the call go in, the result's text
comes out, so nothing it does touches the rollout worker), and the built-in `python` interpreter
tool. Like a reward, this is found by name (`rewards.tools:ToolSandbox`) by the rollout, which
does not import the rewards package.

A sandboxed tool's module must be self-contained: the sandbox holds the interpreter's standard
library and nothing of the project (no imports of the user's other modules)."""
from __future__ import annotations

import inspect
import json
import secrets
from dataclasses import replace

from rewards.sandbox import Limits, run_python

OUTPUT_CHARS = 2000  # what the python tool hands back of a program's output


class ToolFailed(RuntimeError):
    """What a sandboxed program or tool raised, as the model reads it: `Type: message` (`shown`).
    The type and message are the program's own words (text, capped), never run on the host."""

    def __init__(self, shown: str):
        super().__init__(shown)
        self.shown = shown


def failure(res, limits: Limits) -> str | None:
    """How a sandboxed run failed, as `Type: message`, or None when it did not."""
    if res.memory_killed:
        return f"MemoryError: the program went past its memory limit ({limits.memory_mb} MB)"
    first = res.answers[:1]
    if first and first[0].get("op") == "started" and first[0].get("ok") is False:
        return f"{str(first[0].get('error'))[:100]}: {str(first[0].get('message', ''))[:500]}"
    if res.returncode not in (0, None):
        return f"SystemExit: the program ended with status {res.returncode}"
    return None


class ToolSandbox:
    def __init__(self, limits: Limits | None = None, mode: str = "bwrap", **limit_fields):
        """`limits`, or the `Limits` fields given by name (timeout_s, memory_scope, ...)."""
        self.limits, self.mode = limits or Limits(**limit_fields), mode

    def call(self, fn, args: dict, timeout_s: float) -> str:
        """fn(**args) in a sandbox of its own; its result's text. Raises on its failure."""
        mark = f"__hindsight_result_{secrets.token_hex(6)}__"
        module = inspect.getmodule(fn)
        code = (f"{inspect.getsource(module)}\n"
                f"import json as _json\n"
                f"_out = {fn.__name__}(**_json.loads({json.dumps(json.dumps(args))}))\n"
                f"print({mark!r} + _json.dumps(str(_out)))\n")
        res = run_python(code, replace(self.limits, timeout_s=timeout_s), self.mode)
        if res.timed_out:
            raise TimeoutError(f"no answer within {timeout_s:g} s (the sandbox was killed)")
        failed = failure(res, self.limits)
        if failed:  # the tool's own exception, as it raised it
            raise ToolFailed(failed)
        for line in reversed(res.stdout.splitlines()):
            if line.startswith(mark):
                return json.loads(line[len(mark):])
        raise ToolFailed("RuntimeError: the tool returned no answer")

    def python_tool(self, timeout_s: float):
        """The built-in code interpreter, as a TRL-style tool function."""
        box = self

        def python(code: str) -> str:
            """Run a Python program in a sandbox and return what it printed.

            Args:
                code: The Python source to run.
            """
            res = run_python(code, replace(box.limits, timeout_s=timeout_s), box.mode)
            if res.timed_out:
                raise TimeoutError(f"the program ran past {timeout_s:g} s and was killed")
            out = res.stdout + (f"\n[stderr]\n{res.stderr[-OUTPUT_CHARS:]}" if res.stderr.strip() else "")
            failed = failure(res, box.limits)
            if failed:  # a failing program is a failed call: its exception first, then what it printed
                raise ToolFailed(f"{failed}" + (f"\n[output]\n{out[-OUTPUT_CHARS:]}" if out.strip() else ""))
            return out[:OUTPUT_CHARS]

        return python
