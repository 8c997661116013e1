"""The learner's block, `rl.learner`: how a step's batch becomes an update, and the learner group
that trains it. Every knob of the learner lives here and nowhere else: `learning.update
.learner_settings` takes them by name, and the resume fingerprint's training section is this
block's dump (`state.fingerprint`), so a new knob is one field here plus its use site."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from hindsight.config.base import Strict
from hindsight.learning.strategies.catalogue import check_name, get_strategy


class HealthConfig(Strict):
    """When a step has diverged (`learning.health`): bands relative to running medians."""
    enabled: bool = True
    grad_norm_factor: float = Field(100.0, gt=1, description="an optimizer step whose gradient norm is above this "
                                    "times its running median stops the run before its checkpoint")
    loss_factor: float = Field(100.0, gt=1, description="the same for |loss| (above factor x median |loss| + floor)")
    loss_floor: float = Field(1.0, ge=0, description="what |loss| may always reach (RL losses sit near 0)")
    weight_change: float = Field(0.5, gt=0, description="the weights' norm may change by at most this share of "
                                 "itself in one optimizer step")
    warmup_steps: int = Field(3, ge=1, description="optimizer steps before the medians are trusted")
    window: int = Field(20, ge=1, description="optimizer steps the running medians are taken over")


class LearnerConfig(Strict):
    lr: float = Field(1e-4, gt=0)
    clip_eps_low: float = Field(0.2, ge=0)
    clip_eps_high: float = Field(0.2, ge=0)
    clip_ratio_c: float | None = Field(None, gt=1, description="dual-clip (verl): cap a negative advantage's loss at "
                                                               "-A * clip_ratio_c; null turns it off")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "seq_mean_token_mean"
    num_iterations: int = Field(1, ge=1, description="passes over the step's mini-batches (TRL's num_iterations, "
                                                      "verl's ppo_epochs)")
    mini_batch_size: int | None = Field(None, ge=1, description="samples per optimizer step, whole groups (verl's "
                                        "ppo_mini_batch_size; TRL's per_device_train_batch_size x "
                                        "gradient_accumulation_steps); null: the whole step, one optimizer step")
    micro_batch_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        None, description="padded tokens (rows x (prompt + completion)) per forward and backward; gradients "
        "accumulate over a mini-batch's micro-batches. Also bounds the behaviour, reference and critic forwards. "
        "null: a mini-batch at once; auto: fitted at the start from probe forwards and backwards against "
        "memory_cap_mb (hindsight.learning.fit), fitted again when rows grow wider, kept in the checkpoint")
    memory_cap_mb: float | None = Field(None, gt=0, description="what micro_batch_tokens: auto fits under, per learner "
                                        "process; null: the GPU's memory, else the cgroup's limit (or the machine's "
                                        "memory) shared by the group's processes")
    packing: Literal["off", "on", "auto"] = Field("off", description="padding-free micro-batches: a micro-batch's "
                                                  "rows end to end in sequences no wider than its widest row, "
                                                  "positions restarting per row (hindsight.packing), in the update "
                                                  "and the behaviour, reference and critic forwards; auto packs "
                                                  "where it cuts the tokens a forward runs on by 15 %")
    max_grad_norm: float = Field(1.0, gt=0)
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight in the policy loss")
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
