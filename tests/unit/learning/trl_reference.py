"""TRL 1.16's GRPO loss run on given tensors, as the reference our losses are held to.

Only the model call is replaced: `GRPOTrainer._compute_loss` runs as TRL ships it, on a stand-in
trainer whose attributes are the ones `GRPOTrainer.__init__` derives from a real `GRPOConfig`.
The engine importance-sampling ratio is computed by TRL's own block of
`_generate_and_score_completions`, cut out of its source, so no formula here is ours.
"""
from __future__ import annotations

import inspect
import math
import textwrap
from collections import defaultdict
from functools import partial
from types import SimpleNamespace

import torch
from trl import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer


class Accelerator:
    """One process: TRL's collectives are the identity."""
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


def _is_block() -> str:
    """TRL's code that turns the engine's log-probs into `importance_sampling_ratio`."""
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    start = src.index("            if self.use_vllm and self.vllm_importance_sampling_correction:\n"
                      "                mask = completion_mask")
    end = src.index("            # Compute the per-token log probabilities for the reference model", start)
    return textwrap.dedent(src[start:end])


IS_BLOCK = compile(_is_block(), "trl-is-block", "exec")


def config(**fields) -> GRPOConfig:
    return GRPOConfig(output_dir="/tmp/hindsight-trl-reference", report_to=[], use_cpu=True, **fields)


def trainer(args: GRPOConfig, max_len: int, use_vllm: bool):
    """The attributes `_compute_loss` reads, set as `GRPOTrainer.__init__` sets them from `args`."""
    fake = SimpleNamespace(
        args=args, loss_type=args.loss_type, beta=args.beta, epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        importance_sampling_level=args.importance_sampling_level,
        off_policy_mask_threshold=args.off_policy_mask_threshold, top_entropy_quantile=args.top_entropy_quantile,
        use_vllm=use_vllm, vllm_importance_sampling_correction=args.vllm_importance_sampling_correction,
        vllm_importance_sampling_mode=args.vllm_importance_sampling_mode,
        vllm_importance_sampling_clip_min=args.vllm_importance_sampling_clip_min,
        vllm_importance_sampling_clip_max=args.vllm_importance_sampling_clip_max,
        max_completion_length=max_len, current_gradient_accumulation_steps=1,
        entropy_coef=args.entropy_coef, use_adaptive_entropy=args.use_adaptive_entropy,
        _entropy_bonus_enabled=args.entropy_coef != 0.0 or args.use_adaptive_entropy,
        _last_world_entropy=float("inf"), _entropy_window_stats=None,
        aux_loss_enabled=False, accelerator=Accelerator(), model=SimpleNamespace(training=True),
        _metrics=defaultdict(lambda: defaultdict(list)),
        get_off_policy_mask=GRPOTrainer.get_off_policy_mask, get_gamma_weights=GRPOTrainer.get_gamma_weights,
    )
    fake.get_high_entropy_mask = partial(GRPOTrainer.get_high_entropy_mask, fake)
    return fake


def importance_ratio(fake, old: torch.Tensor, engine: torch.Tensor, mask: torch.Tensor,
                     tool_mask: torch.Tensor | None = None) -> torch.Tensor:
    scope = {"self": fake, "old_per_token_logps": old, "sampling_per_token_logps": engine, "completion_mask": mask,
             "tool_mask": tool_mask, "torch": torch, "math": math}
    exec(IS_BLOCK, scope)  # noqa: S102  (TRL's own source, installed)
    return scope["vllm_importance_sampling_ratio"]


def trl_loss(args: GRPOConfig, logp, old, ref, adv, mask, engine=None, entropy=None, tool_mask=None):
    """TRL's loss on these tensors; `engine` given: use_vllm with its sampling log-probs;
    `tool_mask` (multi-turn): 0 on the tokens tools and environments wrote."""
    use_vllm = engine is not None
    fake = trainer(args, mask.size(1), use_vllm)
    fake._get_per_token_logps_and_entropies = lambda *a, **k: (
        logp, entropy if entropy is not None else torch.zeros_like(logp), None)
    inputs = {"prompt_ids": torch.zeros(logp.size(0), 2, dtype=torch.long), "prompt_mask": torch.ones(logp.size(0), 2),
              "completion_ids": torch.zeros_like(mask, dtype=torch.long), "completion_mask": mask,
              "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": (mask if tool_mask is None else mask * tool_mask).sum()}
    if tool_mask is not None:
        inputs["tool_mask"] = tool_mask
    if use_vllm:
        inputs["sampling_per_token_logps"] = engine
        if args.vllm_importance_sampling_correction:
            inputs["importance_sampling_ratio"] = importance_ratio(fake, old, engine, mask, tool_mask)
    return GRPOTrainer._compute_loss(fake, None, inputs), fake._metrics["train"]
