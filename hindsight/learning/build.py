"""One builder for what a learner trains: the policy, the critic and their optimizers.

Every learner rank builds through it (`learning.rank.LearnerRank`, whatever its strategy), so a
setting such as dropout or the adapter's seed cannot differ between them. A
trained model keeps float32 weights, so its optimizer state is float32 too (master weights);
with `model.dtype: bfloat16` its forwards run under autocast (`logprobs.compute_autocast`).
"""
from __future__ import annotations

import torch

from hindsight.models.compat import enable_checkpointing
from hindsight.models.load import FRESH, disable_dropout, fresh_values, load_causal_lm, load_reward_model, missing_names
from hindsight.models.lora import load_adapter, with_adapter


def build_policy(path: str, model_cfg, rl, base: str | None = None, seed: int = 0, resume: bool = False,
                 empty: bool = False):
    """The model at `path`; with `rl.lora`, the model at `base` plus an adapter: the one at
    `path` on resume, else a fresh one (seeded, so it starts the same way every run). `empty`:
    its parameters on the meta device, for a learner strategy that fills them itself."""
    if rl.lora.enabled:
        model = load_causal_lm(base or path, "float32")
        torch.manual_seed(seed)
        model = load_adapter(model, path) if resume else with_adapter(model, rl.lora)
    else:
        model = load_causal_lm(path, "float32", empty=empty)
    return _for_training(model, model_cfg, rl)


def build_critic(path: str, model_cfg, rl, pad_id: int, seed: int = 0, empty: bool = False):
    """A value model (a sequence-classification head read out at every token). A head that no
    checkpoint holds starts from seeded values (`fresh_values`), the same whatever the learner
    strategy; built `empty`, the values wait on the model (`FRESH`) for the strategy to fill in."""
    critic = load_reward_model(path, "float32", empty=empty)
    critic.config.pad_token_id = pad_id
    fresh = fresh_values(critic, missing_names(critic), seed)
    if empty:
        setattr(critic, FRESH, fresh)
    else:
        with torch.no_grad():
            params = dict(critic.named_parameters())
            for name, value in fresh.items():
                params[name].copy_(value)
    return _for_training(critic, model_cfg, rl)


def _for_training(model, model_cfg, rl):
    if rl.learner.disable_dropout:  # rollouts sample in eval mode: with dropout the ratio is not 1 before a step
        disable_dropout(model)
    model.compute_dtype = getattr(torch, model_cfg.dtype)  # read by the forwards' autocast
    if model_cfg.gradient_checkpointing:
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        enable_checkpointing(inner)
    return model


def build_optimizer(model, lr: float) -> torch.optim.Optimizer:
    """AdamW without weight decay (RL's updates are small: decay would dominate them); its resume
    state is the learner strategy's to load."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
