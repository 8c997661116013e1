"""What every config section shares: strict models (an unknown key fails), the reward spec, flattening."""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict



def _reward_spec(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", value):
        raise ValueError(f"{value!r}: expected 'module:function', e.g. rewards.exact:exact_answer")
    return value


RewardSpec = Annotated[str, AfterValidator(_reward_spec)]


class Strict(BaseModel):
    # a float of .inf or .nan is refused where it is read: `rl.lr: .inf` trained NaN weights
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
