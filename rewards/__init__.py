"""Batched reward functions with TRL's signature: fn(completions, **columns) -> list[float].

`columns` are the dataset's other fields (for example `answer`). Completions are strings,
or lists of chat messages for conversational data; `completion_text` handles both.
"""


def completion_text(completion) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)
