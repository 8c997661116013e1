"""The learner's block, `rl.learner`: how a step's batch becomes an update, and the learner group
that trains it. Every knob of the learner lives here and nowhere else: `learning.update
.learner_settings` takes them by name, and the resume fingerprint's training section is this
block's dump (`state.fingerprint`), so a new knob is one field here plus its use site."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic_core import InitErrorDetails
from pydantic import ConfigDict, Field, field_validator, model_validator

from hindsight.config.base import Strict, raise_errors, with_blocks
from hindsight.learning.losses import LOSSES, get_loss
from hindsight.learning.strategies.catalogue import check_name, get_strategy


class HealthConfig(Strict):
    """When a step has diverged (`learning.health`): bands relative to running medians."""
    enabled: bool = True
    grad_norm_factor: float = Field(100.0, gt=1, description="an optimizer step whose gradient norm is above this "
                                    "times its running median (plus grad_norm_floor) stops the run before its checkpoint")
    grad_norm_floor: float = Field(0.01, ge=0, description="what the gradient norm may always reach: a step whose "
                                   "groups nearly tie has a norm near round-off (1e-7), and the first step with "
                                   "signal must not read as a jump of a thousand times")
    loss_factor: float = Field(100.0, gt=1, description="the same for |loss| (above factor x median |loss| + floor)")
    loss_floor: float = Field(1.0, ge=0, description="what |loss| may always reach (RL losses sit near 0)")
    weight_change: float = Field(0.5, gt=0, description="the weights' norm may change by at most this share of "
                                 "itself in one optimizer step")
    warmup_steps: int = Field(3, ge=1, description="optimizer steps before the medians are trusted")
    window: int = Field(20, ge=1, description="optimizer steps the running medians are taken over")


class CorrectionConfig(Strict):
    """The off-policy correction every loss shares (`learning.correction`): the importance weight
    p_learner / p_engine of each sampled token, where the engine's log-probs come from another
    numeric path (vLLM, another dtype) or, in an async run, from the stale weights version."""
    level: Literal["auto", "none", "token", "sequence", "geometric"] = Field(
        "auto", description="auto: sequence with mask (TRL's default) where the engine's log-probs are not the "
                            "learner's own forward (vllm), else none; token: a weight per token; sequence: their "
                            "product; geometric: the product's n-th root (SkyRL's geometric mask)")
    action: Literal["truncate", "mask"] = Field("mask", description="truncate: clamp into [clip_min, clip_max] "
                                                "(TIS); mask: a weight outside it becomes 0 (MIS; IcePop with "
                                                "level token and both bounds)")
    clip_min: float | None = Field(None, ge=0, description="C_min; null: no lower bound")
    clip_max: float | None = Field(3.0, gt=0, description="C_max; null: no upper bound")
    off_policy_mask: float | None = Field(None, gt=0, description="DeepSeek-V3.2's off-policy sequence mask: drop a "
                                          "negative-advantage sequence whose mean KL from the sampler is above this "
                                          "(TRL's off_policy_mask_threshold); null: off")

    @model_validator(mode="after")
    def _bounds(self):
        if self.action == "truncate" and self.clip_min is None and self.clip_max is None:
            raise ValueError("action: truncate needs clip_min or clip_max")
        if self.clip_min is not None and self.clip_max is not None and self.clip_min >= self.clip_max:
            raise ValueError(f"clip_min {self.clip_min} must be below clip_max {self.clip_max}")
        return self


class AdaptiveEntropyConfig(Strict):
    """Skywork-OR1's entropy control (TRL's use_adaptive_entropy): after each optimizer step the
    coefficient rises by `delta` while the entropy is at or below `target`, else falls; it is
    applied only while the entropy is at or below `target`."""
    enabled: bool = False
    target: float = Field(0.2, ge=0, description="nats a token")
    delta: float = Field(0.005, gt=0)
    min: float = Field(0.0, ge=0)
    max: float = Field(1.0, ge=0)


class LearnerConfig(Strict):
    """The policy loss is a registered one (`rl.learner.loss`, `hindsight.learning.losses`); its
    settings sit under `rl.learner.<its name>` (for example `rl.learner.dapo.clip_eps_high`)."""
    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)  # the losses' blocks

    lr: float = Field(1e-4, gt=0)
    loss: str = Field("grpo", description="a registered policy loss: grpo, dapo, bnpo, dr_grpo, gspo, luspo, cispo, "
                                          "sapo, vespo, gmpo, clip_cov, kl_cov (docs/losses.md)")
    correction: CorrectionConfig = Field(default_factory=CorrectionConfig)
    mask_truncated: bool = Field(False, description="completions cut at max_new_tokens are left out of the loss "
                                                    "(DAPO; TRL's mask_truncated_completions)")
    num_iterations: int = Field(1, ge=1, description="passes over the step's mini-batches (TRL's num_iterations, "
                                                      "verl's ppo_epochs)")
    mini_batch_size: int | None = Field(None, ge=1, description="samples per optimizer step, whole groups (verl's "
                                        "ppo_mini_batch_size; TRL's per_device_train_batch_size x "
                                        "gradient_accumulation_steps); null: the whole step, one optimizer step")
    micro_batch_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        None, description="padded tokens (rows x (prompt + completion)) per forward and backward; gradients "
        "accumulate over a mini-batch's micro-batches, and bounds the critic's forwards (rl.forward takes it by "
        "default for the rollout worker's and the scorer's). "
        "null: a mini-batch at once; auto: fitted at the start from probe forwards and backwards against "
        "memory_cap_mb (hindsight.learning.fit), fitted again when rows grow wider, kept in the checkpoint")
    memory_cap_mb: float | None = Field(None, gt=0, description="what micro_batch_tokens: auto fits under, per learner "
                                        "process; null: the GPU's memory, else the cgroup's limit (or the machine's "
                                        "memory) shared by the group's processes")
    packing: Literal["off", "on", "auto"] = Field("off", description="padding-free micro-batches: a micro-batch's "
                                                  "rows end to end in sequences no wider than its widest row, "
                                                  "positions restarting per row (hindsight.maths.packing), in the update "
                                                  "and the critic's forwards (rl.forward takes it by default); auto packs "
                                                  "where it cuts the tokens a forward runs on by 15 %")
    max_grad_norm: float = Field(1.0, gt=0)
    entropy_coef: float = Field(0.0, ge=0, description="the entropy bonus: minus this times the mini-batch's mean "
                                                       "token entropy, whatever the loss (TRL's entropy_coef)")
    top_entropy_quantile: float = Field(1.0, ge=0, le=1, description="train only on the tokens whose entropy is in "
                                        "this top share of a micro-batch's (Beyond the 80/20 rule: 0.2); 1: all")
    adaptive_entropy: AdaptiveEntropyConfig = Field(default_factory=AdaptiveEntropyConfig)
    disable_dropout: bool = Field(True, description="turn dropout off in the policy and critic, so the ratio is 1 "
                                                    "before the first update (false keeps the checkpoint's dropout)")
    processes: int = Field(1, ge=1, description="learner ranks in one torch.distributed group for the stage (this "
                                                "process and processes - 1 Ray actors); the batch stays global")
    strategy: str = Field("ddp", description="a registered learner strategy: ddp, every rank holds the whole policy, "
                                             "critic and Adam state; fsdp2, each holds 1/processes of them (FSDP2; "
                                             "gloo on a CPU, NCCL on GPUs), starts on the meta device and keeps its "
                                             "resume state in torch.distributed.checkpoint shards")
    offload: bool = Field(False, description="fsdp2: keep parameters, gradients and Adam state on the CPU between "
                                             "uses (CPUOffloadPolicy); the step runs there")
    publish_bucket_mb: float = Field(512.0, gt=0, description="new weights go this many MiB at a time: gathered from "
                                                              "an fsdp2 learner's shards, and pushed into a vLLM engine")
    health: HealthConfig = Field(default_factory=HealthConfig)

    @model_validator(mode="wrap")
    @classmethod
    def _loss_blocks(cls, data, handler):
        """Validate the chosen loss's block with its own model; a block of another loss, or any
        other unknown key, is refused with its location (rl.learner.sapo.temperature_pos)."""
        if not isinstance(data, dict):
            return handler(data)
        model, blocks, errors = with_blocks(cls, data, handler, LOSSES, lambda loss: loss.Settings)
        if model is not None:  # another loss's block at its defaults is a dumped config's (a sweep over losses)
            errors += [InitErrorDetails(type="value_error", loc=(name,), input=data.get(name),
                                        ctx={"error": ValueError(f"settings of loss {name}, but rl.learner.loss is "
                                                                 f"{model.loss}: move them under rl.learner."
                                                                 f"{model.loss} or drop them")})
                       for name, block in blocks.items() if name != model.loss and block != type(block)()]
        raise_errors(cls, errors)
        blocks.setdefault(model.loss, get_loss(model.loss).Settings())  # shown in MLflow params
        model.__pydantic_extra__.update({model.loss: blocks[model.loss]})
        return model

    @field_validator("loss")
    @classmethod
    def _loss_registered(cls, name: str) -> str:
        get_loss(name)  # ValueError naming the registered ones
        return name

    def loss_settings(self):
        """The chosen loss's block (`rl.learner.<loss>`), with its defaults when absent."""
        return self.__pydantic_extra__[self.loss]

    @field_validator("strategy")
    @classmethod
    def _registered(cls, name: str) -> str:
        return check_name(name)  # ValueError naming the registered ones

    @model_validator(mode="after")
    def _offload_needs_shards(self):
        if self.offload and not get_strategy(self.strategy).can_offload:
            raise ValueError(f"offload moves a sharded learner's state to the CPU; strategy {self.strategy} keeps it "
                             f"on the device: set strategy: fsdp2")
        return self
