"""Tool calls read out of a model turn's text, one parser a chat template's format, by name.

`hermes` is ChatML/Qwen's: each call a JSON object `{"name": ..., "arguments": {...}}` between
`<tool_call>` and `</tool_call>`. `json` is Llama 3.1's: the whole turn one JSON object with
`name` and `parameters`. A parser is one function registered here; a call it cannot read is
still returned, with the reason, and becomes an error turn the model reads (never a failed step).
"""
from __future__ import annotations

import json
import re
from typing import Callable

from hindsight.data.rows import nesting_depth
from hindsight.registry import Registry
from hindsight.rollout.multiturn.tools import ToolCall

PARSERS: Registry[Callable[[str], list[ToolCall]]] = Registry("tool-call parser")
# A call is read only within these bounds: a model's sample is text of any shape, and json.loads
# of 1,000 nested brackets raises RecursionError, of a 5,000-digit integer ValueError, and deep
# arguments would fail the chat template that renders them back. Past a bound, the call is an
# error turn the model reads.
MAX_CALL_CHARS = 16_384
MAX_DEPTH = 16


def loads(body: str, what: str = "the tool call") -> tuple[object, str | None]:
    """(the JSON value, None) or (None, why it cannot be read): never raises on any string."""
    if len(body) > MAX_CALL_CHARS:
        return None, f"{what} is {len(body):,} characters, over the {MAX_CALL_CHARS:,} a call may take"
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"{what} is not valid JSON ({exc.msg} at character {exc.pos})"
    except (RecursionError, ValueError, MemoryError) as exc:  # nesting, a 5,000-digit integer, a surrogate
        return None, f"{what} cannot be read ({type(exc).__name__})"
    if nesting_depth(value, MAX_DEPTH) > MAX_DEPTH:
        return None, f"{what} nests deeper than {MAX_DEPTH} levels"
    try:  # a lone surrogate (\\ud800) parses, and then fails whatever encodes it: the template, the store
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return None, f"{what} holds text that is not valid Unicode"
    return value, None


register, get_parser = PARSERS.named, PARSERS.lookup


def _call(obj, args_key: str) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", error="a tool call needs a JSON object with a string `name`")
    args = obj.get(args_key, {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args, why = loads(args, f"the arguments of {obj['name'][:80]}")
        if why:
            return ToolCall(obj["name"], error=why)
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error=f"the arguments of {obj['name']} must be a JSON object")
    return ToolCall(obj["name"], args)


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


@register("hermes")
def hermes(text: str) -> list[ToolCall]:
    calls = []
    for body in _HERMES.findall(text):
        obj, why = loads(body.strip())
        calls.append(ToolCall("", error=why) if why else _call(obj, "arguments"))
    return calls


@register("json")
def bare_json(text: str) -> list[ToolCall]:
    body = text.strip()
    if not body.startswith("{"):
        return []
    obj, why = loads(body)
    return [ToolCall("", error=why) if why else _call(obj, "parameters")]
