"""What every config section shares: strict models (an unknown key fails), the reward spec, flattening."""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError
from pydantic_core import InitErrorDetails


def _reward_spec(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
        raise ValueError(f"{value!r}: expected 'module:function', e.g. rewards.exact:exact_answer")
    return value


RewardSpec = Annotated[str, AfterValidator(_reward_spec)]


class Strict(BaseModel):
    # a float of .inf or .nan is refused where it is read: `rl.learner.lr: .inf` trained NaN weights
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def flatten(cfg: BaseModel | dict, prefix: str = "") -> dict[str, str]:
    """Dotted keys for MLflow params: {'rl.kl.coef': '0.04', ...}."""
    data = cfg.model_dump(by_alias=True) if isinstance(cfg, BaseModel) else cfg
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = str(value)
    return out


def with_blocks(cls, data: dict, handler, registry: dict, settings_of) -> tuple[BaseModel, dict, list]:
    """Validate a section whose extra keys are blocks of registered variants (`rl.ppo`,
    `rl.rollout.vllm`): each key naming a registry entry is validated by that entry's settings
    model (`settings_of(entry)`, None when it has none), any other unknown key is refused, and
    every error keeps its location (rl.ppo.lam) for the message. Returns (the section, or None
    when it failed, its blocks, the errors) so the caller can add its own before raising."""
    known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
    errors, blocks = [], {}
    for key, value in data.items():
        if key in known:
            continue
        settings = settings_of(registry[key]) if key in registry else None
        if settings is None:
            errors.append(InitErrorDetails(type="extra_forbidden", loc=(key,), input=value))
            continue
        try:
            blocks[key] = settings.model_validate(value or {})
        except ValidationError as exc:
            errors += [relocated(err, key) for err in exc.errors()]
    try:
        model = handler({k: v for k, v in data.items() if k in known})
    except ValidationError as exc:
        errors = [relocated(err) for err in exc.errors()] + errors
        model = None
    return model, blocks, errors


def relocated(err: dict, *prefix) -> InitErrorDetails:
    return InitErrorDetails(type=err["type"], loc=(*prefix, *err["loc"]), input=err.get("input"), ctx=err.get("ctx", {}))


def raise_errors(cls, errors: list) -> None:
    if errors:
        raise ValidationError.from_exception_data(cls.__name__, errors)
