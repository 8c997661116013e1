"""Cache keys for Prefect: a stage's key comes from its declaration (`hindsight.stage.cache_key`)."""
from __future__ import annotations

import hashlib
import importlib
import json
from functools import lru_cache

from hindsight import PACKAGES
from hindsight.config import PipelineConfig
from hindsight.stage import StageSpec, cache_key, code_version
import tracking

# the code a stage runs: any edit reruns it (the CLI's own code does not)
CODE_PACKAGES = tuple(p for p in PACKAGES if p != "cli")


@lru_cache(maxsize=1)
def our_code() -> str:
    return code_version(*(importlib.import_module(name) for name in CODE_PACKAGES))


def declared_key(spec: StageSpec, cfg: PipelineConfig, model_versions: dict, data_md5: str) -> str:
    return cache_key(spec, cfg, model_versions, data_md5, tracking.store_id(cfg), our_code())


def stage_key(stage: str, config_part: dict, inputs: dict, store: str) -> str:
    """For the sweep's own tasks, which are not declared stages."""
    blob = json.dumps({"stage": stage, "config": config_part, "inputs": inputs, "code": our_code(), "store": store},
                      sort_keys=True, default=str)
    return f"hindsight-{stage}-" + hashlib.sha256(blob.encode()).hexdigest()[:24]


def cache_key_from_inputs(context, parameters) -> str:
    """Prefect cache_key_fn: every cached task takes a precomputed `cache_key` parameter."""
    return parameters["cache_key"]
