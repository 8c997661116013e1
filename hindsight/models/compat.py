"""transformers' activation checkpointing under both of its names: 5.20 renamed
`gradient_checkpointing` (the model method, its flag and TrainingArguments' fields) to
`activation_checkpointing`; vLLM's CPU build pins transformers below 5.20, so hindsight runs on both
sides of the rename. Only these few names moved for the code hindsight calls."""
from __future__ import annotations

_NEW = "activation_checkpointing"


def enable_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing on `model` (a PreTrainedModel)."""
    if hasattr(model, f"{_NEW}_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def checkpointing_args(on: bool) -> dict:
    """TrainingArguments' fields for it, by the name the installed transformers has."""
    from transformers import TrainingArguments

    name = _NEW if _NEW in TrainingArguments.__dataclass_fields__ else "gradient_checkpointing"
    return {name: on, f"{name}_kwargs": {"use_reentrant": False} if on else None}
