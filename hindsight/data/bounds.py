"""A prompt's length in tokens, bounded before any tensor is made: a prompt longer than the
model can read (or than `data.max_prompt_tokens`) is one error naming its file and row, found
before a model loads or an MLflow run starts. Counting never costs more than the cap allows: a
text longer than `MAX_CHARS_PER_TOKEN` characters a token of the cap is over it whatever it
tokenizes to (no vocabulary has tokens that long on average), so it is refused untokenized."""
from __future__ import annotations

from hindsight.data.chat import prompt_text
from hindsight.errors import DataError

MAX_CHARS_PER_TOKEN = 64


def prompt_cap(max_prompt_tokens: int | None, context: int | None, new_tokens: int) -> int | None:
    """The longest prompt: the configured one, else the model's context less what it generates."""
    if max_prompt_tokens:
        return max_prompt_tokens
    return context - new_tokens if context and context > new_tokens else None


def check_prompt_lengths(rows: list[dict], tok, cap: int | None, source: str, what: str, render=None) -> None:
    """Every row's prompt, as the model is prompted with it (the chat template applied; `render(prompt)`
    when given: a multi-turn prompt with its tools' schemas), within `cap` tokens."""
    if not cap:
        return
    render = render or (lambda prompt: prompt_text(tok, prompt))
    for i, row in enumerate(rows):
        text = render(row["prompt"])
        where = f"{source}:{i + 1}" if source.endswith(".jsonl") else f"{source} row {i}"
        if len(text) > cap * MAX_CHARS_PER_TOKEN:
            n = f"more than {cap}"
        elif len(text) <= cap:  # a token is at least one character: under the cap whatever it tokenizes to
            continue
        else:
            count = len(tok(text, add_special_tokens=False)["input_ids"])
            if count <= cap:
                continue
            n = str(count)
        raise DataError(f"{where}: the prompt is {n} tokens, more than the {cap} {what} allows; shorten it, or "
                        f"set data.max_prompt_tokens")


def longest_prompt(rows: list[dict], tok, render=None) -> int:
    """The most tokens any row's prompt takes, the chat template applied (`render` as in
    `check_prompt_lengths`)."""
    render = render or (lambda prompt: prompt_text(tok, prompt))
    texts = [render(row["prompt"]) for row in rows]
    return max((len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]), default=1)
