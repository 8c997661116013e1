"""Check a stage's inputs before it starts.

A bad dataset or reward spec fails in a second, before any model loads, MLflow run or file
is created, instead of after an hour of SFT when the pipeline reaches RL.
"""
from __future__ import annotations

from hindsight.config import PipelineConfig
from hindsight.data import load_rows
from hindsight.scoring import load_reward_fn

# stage -> (data config field, columns the stage reads)
STAGE_DATA = {
    "sft": ("sft", ("prompt", "completion")),
    "reward-model": ("prefs", ("prompt", "chosen", "rejected")),
    "rl": ("prompts", ("prompt",)),
}


def check_inputs(cfg: PipelineConfig, stages: list[str]) -> None:
    d = cfg.data
    columns = d.columns or None
    for stage in stages:
        field, required = STAGE_DATA[stage]
        load_rows(getattr(d, field), required=required, split=d.split, columns=columns)
        if stage == "rl":
            for reward in cfg.rl.rewards:
                load_reward_fn(reward.fn)
            if cfg.rl.rollout.backend == "vllm":
                from hindsight.rollout.vllm import require_vllm

                require_vllm()
    if {"sft", "rl"} & set(stages):
        load_rows(d.eval, required=("prompt",), split=d.eval_split, columns=columns, limit=cfg.eval.limit)
        load_reward_fn(cfg.eval.reward)
