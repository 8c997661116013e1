"""The chat template's side of a multi-turn rollout: the first prompt with the tools' schemas,
and the tokens that bridge a model turn to the next one (tool results or an environment's
message, then the assistant's header), rendered by the template itself.

The model's own tokens are never rendered again: a trajectory is the sampled ids with these
bridges appended (as TRL's `_get_tool_suffix_ids` and verifiers' `bridge_to_next_turn` build
it). A bridge is cut from a template rendering of a short dummy conversation: everything after
the dummy assistant turn's end token (its trailing newline included, which the model never
samples). `retokenized` is what re-applying the template to the decoded history would give: the
rollout counts where it differs, never trains on it.
"""
from __future__ import annotations

from functools import lru_cache

from hindsight.errors import ConfigError

_SENTINELS = ("tool_name_q7", "arg_key_q7", "arg_val_q7", "tool_content_q7")


def template_problem(tok) -> str | None:
    """Why the tokenizer's chat template cannot carry a tool conversation (user -> assistant with
    tool calls -> tool), or None. A template that silently drops a part of it is refused."""
    if not getattr(tok, "chat_template", None):
        return "the tokenizer has no chat template"
    name, key, val, content = _SENTINELS
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": name, "arguments": {key: val}}}]},
                {"role": "tool", "name": name, "content": content}]
    try:
        text = tok.apply_chat_template(messages, tokenize=False)
    except Exception as exc:
        return f"the chat template cannot render a tool conversation ({type(exc).__name__}: {exc})"
    lost = [s for s in _SENTINELS if s not in text]
    if lost:
        return "the chat template drops tool calls or tool results (a template without tool support)"
    return None


def opening(prompt, extra: str | None) -> list[dict]:
    """The conversation a trajectory opens with: the prompt as a user turn (or the conversation
    given), with what the environment's `reset` returned appended to the last user message
    (TRL's rule)."""
    messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if extra:
        last = max(i for i, m in enumerate(messages) if m["role"] == "user")
        messages[last]["content"] = f"{messages[last]['content']}{extra}"
    return messages


def first_prompt(tok, prompt, tools: list[dict], extra: str | None) -> list[int]:
    """The token ids a trajectory starts from, with the tools' schemas rendered by the template."""
    return list(tok.apply_chat_template(opening(prompt, extra), tools=tools or None, add_generation_prompt=True,
                                        tokenize=True, return_dict=False))


def first_prompt_text(tok, tools: list[dict]):
    """`render(prompt)` for the prompt-length checks: the text `first_prompt` tokenizes (the
    environment's `reset` text, known only per trajectory, left out)."""
    return lambda prompt: tok.apply_chat_template(opening(prompt, None), tools=tools or None, add_generation_prompt=True,
                                                  tokenize=False)


def bridge(tok, messages: list[dict], end_ids) -> list[int]:
    """The ids between a model turn's end token and the next model turn's first token: the
    template's rendering of `messages` (tool results, or the environment's user turn) and the
    assistant header."""
    name = messages[0].get("name", "tool") if messages[0]["role"] == "tool" else None
    head = _head(name)
    prefix = _prefix(tok, name)
    full = list(tok.apply_chat_template(head + messages, add_generation_prompt=True, tokenize=True,
                                        return_dict=False))
    ends = [i for i, t in enumerate(prefix) if t in set(end_ids)]
    if not ends:
        raise ConfigError("the chat template closes an assistant turn with none of the model's end tokens: "
                          "a multi-turn rollout cannot tell where a turn ends")
    cut = ends[-1] + 1
    if full[:cut] != list(prefix[:cut]):
        raise ConfigError("the chat template renders an earlier turn differently once a later one follows: "
                          "turns cannot be appended as tokens")
    return full[cut:]


def _head(tool_name: str | None) -> list[dict]:
    """The dummy conversation a bridge is cut from: a user turn and an assistant turn (a call of
    the tool answering, for a tool's result: some templates name the tool from the call)."""
    if tool_name is None:
        dummy = {"role": "assistant", "content": "ok"}
    else:
        dummy = {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": tool_name, "arguments": {}}}]}
    return [{"role": "user", "content": "hi"}, dummy]


@lru_cache(maxsize=256)
def _prefix(tok, tool_name: str | None) -> tuple[int, ...]:
    """The dummy conversation's ids: the same for every bridge of a tool, rendered once."""
    return tuple(tok.apply_chat_template(_head(tool_name), tokenize=True, return_dict=False))


def retokenized(tok, prompt, tools: list[dict], extra: str | None, turns: list[dict]) -> list[int]:
    """What rendering the decoded conversation through the template again would give, for the
    mismatch count: the model turns as assistant messages of their decoded text, each tool
    result as its own tool message."""
    messages = opening(prompt, extra)
    for turn in turns:
        if turn.get("calls"):
            messages += [{"role": "tool", "name": c["tool"], "content": c["result"]} for c in turn["calls"]]
        else:
            messages.append({"role": turn["role"], "content": turn["text"]})
    return list(tok.apply_chat_template(messages, tools=tools or None, tokenize=True, return_dict=False))
