"""The RL-only config the CLI tests write: a tiny model from `tiny_init`, the demo data, no
SFT or reward model, a few short steps. Each test changes only what it is about."""
from __future__ import annotations

from pathlib import Path

import yaml


def rl_only(name: str, data: Path, init: str, steps: int = 2, eval_: dict | None = None, **rl) -> dict:
    return {
        "name": name, "seed": 0, "model": {"base": "tiny://demo"},
        "sft": {"enabled": False}, "reward_model": {"enabled": False},
        "data": {"dir": str(data), "dvc_file": None, "build_demo": False,
                 "prompts": str(data / "prompts.jsonl"), "eval": str(data / "eval.jsonl")},
        "rl": {"init": init, "steps": steps, "prompts_per_step": 2, "samples_per_prompt": 2,
               "rollout": {"max_new_tokens": 3}, **rl},
        "eval": {"limit": 4, "max_new_tokens": 3, **(eval_ or {})},
    }


def write(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path
