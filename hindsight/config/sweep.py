"""Hyperparameter sweeps: the sweep file, its trials, and their ranking (no Prefect, no MLflow).

A sweep varies dotted config keys of a base pipeline config. Every trial shares the base's
SFT and reward model and runs its own RL stage in its own run directory, registering a
version of NAME-policy; the best trial's version gets the alias `best`.
"""
from __future__ import annotations

import copy
import itertools
import math
import random
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from hindsight.config import PipelineConfig, Strict, load_config
from hindsight.config.legacy import current_path
from hindsight.config.yamlfile import describe_errors, read_yaml_mapping
from hindsight.errors import ConfigError


class Range(Strict):
    """A continuous range for random search; `log` samples uniformly in log space (learning rates)."""
    low: float
    high: float
    log: bool = False


class SweepEarlyStop(Strict):
    """Stop a trial whose fitted curve cannot reach the leader's (`hindsight.lookback.early_stop`)."""
    enabled: bool = False
    metric: Literal["reward/mean", "eval/accuracy"] = Field("reward/mean", description="the fitted curve compared")
    min_steps: int = Field(4, ge=2, description="no trial stops before this many steps")


class SweepConfig(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    base: str = Field(description="pipeline config the trials start from, relative to the sweep file")
    method: Literal["grid", "random"] = "grid"
    trials: int | None = Field(None, ge=1, description="random search: how many trials")
    seed: int = 0
    metric: str = Field("eval/accuracy", description="the RL run's final metric that ranks trials")
    mode: Literal["max", "min"] = "max"
    max_concurrency: int = Field(2, ge=1, description="trials running at once")
    deployment: str | None = Field(None, description="submit each trial as a run of this Prefect deployment "
                                                     "(e.g. rl/rl-local) to its work pool; default: local processes")
    set: dict[str, Any] = Field(default_factory=dict, description="overrides applied to every trial")
    params: dict[str, list | Range] = Field(description="dotted key -> values (grid or random) or a range (random)")
    early_stop: SweepEarlyStop = Field(default_factory=SweepEarlyStop)

    @model_validator(mode="after")
    def _consistent(self):
        if not self.params:
            raise ValueError("params: at least one key to vary")
        if self.method == "grid":
            ranges = [k for k, v in self.params.items() if isinstance(v, Range)]
            if ranges:
                raise ValueError(f"params.{ranges[0]}: a grid needs a list of values, not a range")
        elif self.trials is None:
            raise ValueError("trials: random search needs a number of trials")
        if self.early_stop.enabled and self.mode != "max":
            raise ValueError("early_stop: compares fitted asymptotes of a reward or accuracy, so mode must be max")
        empty = [k for k, v in self.params.items() if isinstance(v, list) and not v]
        if empty:
            raise ValueError(f"params.{empty[0]}: empty list of values")
        return self


def load_sweep(path: str | Path, overrides: list[str] | tuple = ()) -> tuple[SweepConfig, PipelineConfig, Path]:
    """The sweep, its base config (with the sweep's `set`) and the base's path."""
    path = Path(path)
    raw, text = read_yaml_mapping(path, overrides, what="sweep")
    try:
        sweep = SweepConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_errors(exc, path, text)) from None
    base_path = (path.parent / sweep.base).resolve()
    base = load_config(base_path, [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}"
                                   for k, v in sweep.set.items()])
    return sweep, base, base_path


def trial_params(sweep: SweepConfig) -> list[dict[str, Any]]:
    """Grid: every combination, in key order. Random: `trials` draws from a seeded generator."""
    keys = list(sweep.params)
    if sweep.method == "grid":
        return [dict(zip(keys, combo)) for combo in itertools.product(*(sweep.params[k] for k in keys))]
    rng = random.Random(sweep.seed)
    return [{k: _draw(rng, sweep.params[k]) for k in keys} for _ in range(sweep.trials)]


def _draw(rng: random.Random, space):
    if isinstance(space, list):
        return rng.choice(space)
    if space.log:
        return math.exp(rng.uniform(math.log(space.low), math.log(space.high)))
    return rng.uniform(space.low, space.high)


def trial_config(sweep: SweepConfig, base: PipelineConfig, index: int, params: dict, sweep_file: Path) -> PipelineConfig:
    """The base config with the trial's values and its own run directory; a bad key names the sweep file."""
    raw = copy.deepcopy(base.model_dump(mode="json", by_alias=True))
    raw["run_dir"] = str(Path(base.root).parent / sweep.name / trial_id(index))
    if sweep.early_stop.enabled:  # the trials post their fitted curves here and read each other's
        raw.setdefault("lookback", {})["early_stop"] = {
            "board": str(Path(base.root).parent.resolve() / sweep.name / "curves"),
            "metric": sweep.early_stop.metric, "min_steps": sweep.early_stop.min_steps}
    for key, value in params.items():
        key = current_path(key)  # a deprecated spelling, said once
        node = raw
        for part in key.split(".")[:-1]:
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"{sweep_file}: params.{key}: {part} is not a config table")
            node = node[part]
        node[key.split(".")[-1]] = value
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc']))}: {'unknown key' if e['type'] == 'extra_forbidden' else e['msg']}"
                           for e in exc.errors())
        raise ConfigError(f"{sweep_file}: trial {trial_id(index)} {params}: {detail}") from None


def trial_id(index: int) -> str:
    return f"t{index:02d}"


def rank(results: list[dict], metric: str, mode: str) -> list[dict]:
    """Finished trials best first (ties keep trial order), then those stopped early, then failed ones."""
    done = [r for r in results if r.get("status") == "finished" and r.get(metric) is not None]
    stopped = [r for r in results if r.get("status") == "stopped"]
    failed = [r for r in results if r not in done and r not in stopped]
    done.sort(key=lambda r: -r[metric] if mode == "max" else r[metric])
    return [{**r, "rank": i + 1} for i, r in enumerate(done)] + [{**r, "rank": None} for r in stopped + failed]
