"""Conversational data, as TRL takes it: a text column may hold chat messages
([{"role", "content"}, ...]) instead of a string, and the tokenizer's chat template turns a
conversation into the model's text.

Rows are normalised once, when they are loaded (`normalise_row`), to the columns the stages
read: a `messages` column becomes `prompt` (the turns before the last assistant turn) plus
`completion` (that turn) for SFT, or `prompt` alone for RL and evaluation; conversational
`chosen`/`rejected` without a prompt give up their shared turns as the prompt (TRL's
"implicit prompt"). SFT and the reward model then hand conversations to TRL, which applies
the template; the RL sampler and the evaluation apply it themselves (`prompt_text`).

With `data.prompt_format: chat`, plain-text columns become turns (`as_chat`): a GSM8K question
is prompted as a user turn of the model's template, as the instruct model was trained to read it.
"""
from __future__ import annotations


def is_conversation(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def prompt_text(tok, prompt) -> str:
    """The text the model is prompted with: a string as it is, a conversation through the
    tokenizer's chat template with the assistant's turn opened."""
    if not is_conversation(prompt):
        return prompt
    if not getattr(tok, "chat_template", None):
        raise ValueError("conversational prompts need a tokenizer with a chat template")
    return tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def _split_last_assistant(messages: list[dict]) -> tuple[list[dict], list[dict]]:
    if messages and messages[-1].get("role") == "assistant":
        return messages[:-1], messages[-1:]
    return messages, []


def normalise_row(row: dict, required: tuple[str, ...]) -> dict:
    """The columns `required` asks for, derived from conversational columns where missing."""
    if "prompt" in required and "prompt" not in row and is_conversation(row.get("messages")):
        prompt, last = _split_last_assistant(row["messages"])
        row = {**row, "prompt": prompt}
        if "completion" in required and "completion" not in row and last:
            row["completion"] = last
    if "prompt" in required and "prompt" not in row and is_conversation(row.get("chosen")) \
            and is_conversation(row.get("rejected")):
        shared = 0
        for a, b in zip(row["chosen"], row["rejected"]):
            if a != b:
                break
            shared += 1
        row = {**row, "prompt": row["chosen"][:shared], "chosen": row["chosen"][shared:],
               "rejected": row["rejected"][shared:]}
    return row


def as_chat(row: dict, required: tuple[str, ...], system: str | None = None) -> dict:
    """The row with its text columns as chat turns: the prompt a user turn (after a system turn
    when `system` is given and the prompt has none), a completion, chosen or rejected text the
    assistant's turn. Columns that already hold turns keep them."""
    out = dict(row)
    if "prompt" in required and "prompt" in row:
        turns = [{"role": "user", "content": row["prompt"]}] if isinstance(row["prompt"], str) else list(row["prompt"])
        if system is not None and not any(t.get("role") == "system" for t in turns if isinstance(t, dict)):
            turns = [{"role": "system", "content": system}, *turns]
        out["prompt"] = turns
    for column in ("completion", "chosen", "rejected"):
        if column in required and isinstance(row.get(column), str):
            out[column] = [{"role": "assistant", "content": row[column]}]
    return out


def display_prompt(prompt) -> str:
    """A prompt as a person reads it in a report: a string as it is, a conversation one
    `role: content` line per turn."""
    if not is_conversation(prompt):
        return str(prompt)
    return "\n".join(f"{m['role']}: {m.get('content', '')}" for m in prompt)


def format_of(rows: list[dict], column: str = "prompt") -> str:
    """'chat' when the first row's column holds turns, else 'text'."""
    return "chat" if rows and is_conversation(rows[0].get(column)) else "text"
