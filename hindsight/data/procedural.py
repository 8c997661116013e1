"""Procedural data: tasks generated with a verifier for each, from `reasoning-gym` (PyPI).

    data.prompts: "rg://chain_sum?size=4000&seed=1&holdout=0.2&split=train&max_digits=2"
    data.eval:    "rg://chain_sum?size=200&seed=2&holdout=0.2&split=eval&max_digits=2"

`rg://NAME?size=N&seed=S&...` is `reasoning_gym.create_dataset(NAME, size=N, seed=S, ...)`.
`holdout=F&split=train|eval` keeps one side of a split by each question's hash, so training
and eval never share a question (and eval's questions are distinct). The other query keys are
the task's own settings (numbers are parsed as numbers). Each row holds
the question as `prompt`, the gold `answer`, and the whole entry (`rg_entry`, JSON) that the
task's own scorer reads (`rewards.reasoning_gym:rg_score`). The spec string, seed and split
included, is the data's version: it names exactly the rows it generates, as a DVC md5 does
for a file (and the installed reasoning-gym version goes with it into the cache key).
"""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from urllib.parse import parse_qsl, urlsplit

from hindsight.errors import DataError

SCHEME = "rg://"
# What one spec may ask of the generator, checked before anything is generated: the rows kept,
# the rows made to find them on one side of a held-out split, and each numeric setting (a
# generator asked for 10^308 digits, or for 48 million rows to find four, runs for hours).
MAX_ROWS = 100_000
MAX_GENERATED = 1_000_000
MAX_SETTING = 10**6


def is_procedural(source: str) -> bool:
    return source.startswith(SCHEME)


def parse_spec(source: str) -> tuple[str, dict]:
    """(task name, create_dataset's keyword arguments) of an `rg://` source."""
    parts = urlsplit(source)
    name = parts.netloc or parts.path.lstrip("/")
    kwargs = {k: _number(v) for k, v in parse_qsl(parts.query, keep_blank_values=True)}
    if not name:
        raise DataError(f"{source}: no task named (rg://TASK?size=N&seed=S)")
    for key in ("size", "seed"):
        if not isinstance(kwargs.get(key), int):
            raise DataError(f"{source}: {key}= must be given as an integer, so the rows are the same every run")
    if not 1 <= kwargs["size"] <= MAX_ROWS:
        raise DataError(f"{source}: size={kwargs['size']} must be between 1 and {MAX_ROWS:,} rows")
    for key, value in kwargs.items():
        if key not in ("size", "seed", "holdout") and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and not abs(value) <= MAX_SETTING:  # not <=: NaN is refused too
            raise DataError(f"{source}: {key}={value} is beyond what a generator is asked for here (at most "
                            f"{MAX_SETTING:,} in size)")
    return name, kwargs


def _number(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return {"true": True, "false": False}.get(text.lower(), text)


def version(source: str) -> str:
    """What the rows depend on: the spec and the generator's version."""
    from importlib.metadata import PackageNotFoundError, version as installed

    try:
        return f"{source}|reasoning-gym {installed('reasoning-gym')}"
    except PackageNotFoundError:
        return source


def held_out(question: str, fraction: float) -> bool:
    """Whether a question is in the held-out part: decided by the question's own hash, so the
    same question is on the same side whatever seed or size generated it."""
    digest = hashlib.sha256(question.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def load_procedural(source: str) -> list[dict]:
    """`size` rows of the task (a fresh list of fresh dicts: the caller may change them)."""
    return [dict(row) for row in _generated(source)]


@lru_cache(maxsize=8)
def _generated(source: str) -> tuple[dict, ...]:
    """The rows, made once a process: the stage's preflight and the stage read the same spec,
    and generating 4,000 rows takes about a second."""
    return tuple(_generate(source))


def _generate(source: str) -> list[dict]:
    """`size` rows of the task. With `holdout=F&split=train|eval`, only questions on that side
    of the hash split: small tasks repeat questions (chain_sum of two 1-2 digit numbers has about
    2,000), so two seeds alone would evaluate on questions the run trained on."""
    name, kwargs = parse_spec(source)
    size, fraction, split = kwargs.pop("size"), kwargs.pop("holdout", None), kwargs.pop("split", None)
    if (fraction is None) != (split is None) or split not in (None, "train", "eval") or not (
            fraction is None or 0 < fraction < 1):
        raise DataError(f"{source}: a held-out split needs both holdout= (a fraction between 0 and 1) and "
                        f"split=train or split=eval")
    try:
        import reasoning_gym
    except ImportError:
        raise DataError(f"{source}: procedural data needs the reasoning-gym package (pip install reasoning-gym)") from None
    made = size if fraction is None else int(size / (fraction if split == "eval" else 1 - fraction) * 1.2) + 8
    if made > MAX_GENERATED:
        raise DataError(f"{source}: holdout={fraction} with split={split} asks for about {made:,} rows to find {size:,} "
                        f"on its side, over the cap of {MAX_GENERATED:,}: raise holdout= or lower size=")
    while True:  # generate more until `size` questions fall on this side, within the cap
        rows = _side(_entries(reasoning_gym, source, name, made, kwargs), fraction, split)[:size]
        if len(rows) == size:
            break
        if made >= MAX_GENERATED:
            raise DataError(f"{source}: only {len(rows)} of {size} questions fall in the {split} split")
        made = min(made * 2, MAX_GENERATED)
    return [{"id": f"{name}-{kwargs['seed']}-{i}", "prompt": e["question"], "answer": str(e["answer"]),
             "rg_entry": json.dumps(e, default=str)} for i, e in rows]


def _side(entries: list[dict], fraction: float | None, split: str | None) -> list[tuple[int, dict]]:
    if fraction is None:
        return list(enumerate(entries))
    seen, out = set(), []
    for i, e in enumerate(entries):
        if held_out(e["question"], fraction) == (split == "eval") and not (split == "eval" and e["question"] in seen):
            seen.add(e["question"])
            out.append((i, e))
    return out


def _entries(reasoning_gym, source: str, name: str, size: int, kwargs: dict) -> list[dict]:
    try:
        dataset = reasoning_gym.create_dataset(name, size=size, **kwargs)
        return [dataset[i] for i in range(len(dataset))]
    except Exception as exc:  # an unknown task, or settings the task refuses
        raise DataError(f"{source}: reasoning-gym cannot make it ({type(exc).__name__}: {str(exc)[:200]})") from None
