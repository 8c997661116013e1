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

from hindsight.rollout.multiturn.tools import ToolCall

PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {}


def register(name: str):
    def add(fn):
        PARSERS[name] = fn
        return fn
    return add


def get_parser(name: str) -> Callable[[str], list[ToolCall]]:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; registered: {', '.join(sorted(PARSERS))}") from None


def _call(obj, args_key: str) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", error="a tool call needs a JSON object with a string `name`")
    args = obj.get(args_key, {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as exc:
            return ToolCall(obj["name"], error=f"the arguments of {obj['name']} are not JSON: {exc.msg}")
    if not isinstance(args, dict):
        return ToolCall(obj["name"], error=f"the arguments of {obj['name']} must be a JSON object")
    return ToolCall(obj["name"], args)


_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


@register("hermes")
def hermes(text: str) -> list[ToolCall]:
    calls = []
    for body in _HERMES.findall(text):
        try:
            calls.append(_call(json.loads(body.strip()), "arguments"))
        except json.JSONDecodeError as exc:
            calls.append(ToolCall("", error=f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})"))
    return calls


@register("json")
def bare_json(text: str) -> list[ToolCall]:
    body = text.strip()
    if not body.startswith("{"):
        return []
    try:
        return [_call(json.loads(body), "parameters")]
    except json.JSONDecodeError as exc:
        return [ToolCall("", error=f"the tool call is not valid JSON ({exc.msg} at character {exc.pos})")]
