"""Stage cache keys: the stage's config, its input versions, the data md5 and our code."""
from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path

import hindsight
import rewards


@lru_cache(maxsize=1)
def code_version() -> str:
    """Hash of the core's source: a change to the maths invalidates every cached stage."""
    h = hashlib.sha256()
    for pkg in (hindsight, rewards):
        root = Path(pkg.__file__).parent
        for path in sorted(root.rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def stage_key(stage: str, config_part: dict, inputs: dict, store: str) -> str:
    """`store` names the MLflow store (see `tracking.store_id`): a cached result points at a
    version registered there, so it is not valid against another store, or a recreated one."""
    blob = json.dumps({"stage": stage, "config": config_part, "inputs": inputs, "code": code_version(), "store": store},
                      sort_keys=True, default=str)
    return f"hindsight-{stage}-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


def cache_key_from_inputs(context, parameters) -> str:
    """Prefect cache_key_fn: every stage task takes a precomputed `cache_key` parameter."""
    return parameters["cache_key"]
