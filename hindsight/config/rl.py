"""The RL section: rollout, rewards, KL, workers, async, dynamic sampling, replay, alerts, and each
registered algorithm's own block (`rl.<name>`)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails

from hindsight.learning.algorithms import ALGORITHMS, get_algorithm
from hindsight.lookback.alerts import RULES
from hindsight.config.base import RewardSpec, Strict
from hindsight.config.data import LoraConfig


class RewardFnConfig(Strict):
    fn: RewardSpec = Field(description="module:function, called as TRL does: fn(prompts=, completions=, "
                                       "completion_ids=, **dataset columns, **args)")
    weight: float = 1.0
    args: dict[str, Any] = Field(default_factory=dict, description="the reward's own keyword arguments")
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$",
                             description="key of its scores and metrics; default the function's name, "
                                         "numbered when two rewards share it")


class VLLMConfig(Strict):
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1,
                                          description="share of the GPU vLLM may take; the learner needs the rest")
    max_model_len: int = Field(2048, ge=16)
    dtype: str = Field("auto", description="vLLM's dtype; auto follows the checkpoint")


class RolloutConfig(Strict):
    backend: Literal["hf", "vllm"] = Field("hf", description="hf: transformers generate; vllm: a resident vLLM "
                                                             "engine (optional extra, CUDA GPU)")
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    groups_per_batch: int = Field(8, ge=1, description="hf: sample (and score) this many consecutive groups in one "
                                                       "batch, one prefill per prompt. Batches are fixed by group "
                                                       "index and dealt whole, so a group's samples never depend on "
                                                       "the worker count; 1: each group alone")
    logprobs: Literal["forward", "decode"] = Field(
        "forward", description="hf: the behaviour log-probs from one forward after decoding (the same bits "
                               "whatever the worker's thread count), or read off the decoding logits (one "
                               "forward fewer; equal to ~1e-6, the same bits at one thread count)")


class KLConfig(Strict):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
    coef: float = Field(0.04, ge=0)
    estimator: Literal["k1", "k2", "k3"] = "k3"
    placement: Literal["loss", "reward"] = Field(
        "loss", alias="in", description="loss: a KL term in the policy loss; reward: a penalty folded into the reward")


class RoleResources(Strict):
    num_cpus: float = Field(0.5, ge=0)
    num_gpus: float = Field(0.0, ge=0)


class WorkersConfig(Strict):
    rollout: int = Field(1, ge=1, description="rollout workers; groups are seeded each on their own, so the "
                                              "count never changes what is sampled")
    scorer: int = Field(1, ge=1, description="scorers (reward functions, reference and reward model)")
    learner: int = Field(1, ge=1, description="learner processes in one torch.distributed group for the stage "
                                              "(this process and learner - 1 Ray actors); the batch stays global")
    learner_strategy: Literal["ddp", "fsdp2"] = Field(
        "ddp", description="ddp: every learner rank holds the whole policy, critic and Adam state; fsdp2: each "
                           "holds 1/learner of them (FSDP2; gloo on a CPU, NCCL on GPUs), with resume state in "
                           "torch.distributed.checkpoint shards")
    learner_offload: bool = Field(False, description="fsdp2: keep parameters, gradients and Adam state on the CPU "
                                                     "between uses (CPUOffloadPolicy); the step runs there")
    publish_bucket_mb: float = Field(512.0, gt=0, description="new weights go this many MiB at a time: gathered "
                                                              "from an fsdp2 learner's shards, and pushed into a "
                                                              "vLLM engine")
    lease_ttl_s: float = Field(600.0, gt=0, description="a leased group not sealed by then is issued again")
    placement_timeout_s: float = Field(60.0, gt=0, description="an actor the Ray cluster has not placed by then is "
                                                              "dropped (a line in the log); the run keeps the "
                                                              "workers it has")
    placement: Literal["local", "ray"] = Field(
        "local", description="local: the workers run in the stage's process; ray: each is a Ray actor")
    resources: dict[Literal["rollout", "scorer", "learner"], RoleResources] = Field(
        default_factory=dict, description="what each Ray actor of a role reserves; default 0.5 CPU, no GPU (2 "
                                          "rollout workers and a scorer fit a 2-core laptop)")
    ray_address: str | None = Field(None, description="join this Ray cluster (else $RAY_ADDRESS, else an "
                                                      "embedded local one)")


    def of(self, role: str) -> RoleResources:
        return self.resources.get(role) or RoleResources()

    def needs(self) -> dict[str, float]:
        """What the whole layout reserves on the cluster (learner rank 0 is the stage's process)."""
        counts = {"rollout": self.rollout, "scorer": self.scorer, "learner": self.learner - 1}
        return {"CPU": sum(n * self.of(r).num_cpus for r, n in counts.items()),
                "GPU": sum(n * self.of(r).num_gpus for r, n in counts.items())}

    @model_validator(mode="after")
    def _ray_for_more_learners(self):
        if self.learner > 1 and self.placement != "ray":
            raise ValueError("learner > 1 runs its other ranks as Ray actors: set rl.workers.placement: ray")
        if self.learner_offload and self.learner_strategy != "fsdp2":
            raise ValueError("learner_offload moves a sharded learner's state to the CPU: set learner_strategy: fsdp2")
        return self


class AsyncConfig(Strict):
    max_staleness: int = Field(0, ge=0, description="k: step s is sampled with weights version s - k (version 0 "
                                                    "for s < k), by a sampler process, while the learner trains "
                                                    "the k steps before it. 0: on-policy, sampling and learning "
                                                    "take turns")
    is_correction: Literal["none", "tis"] = Field(
        "none", description="tis: weight the policy loss by min(p_learner / p_engine, is_cap), the gap between "
                            "the sampling engine's log-probs (vLLM) and the learner's recompute of them")
    is_cap: float = Field(2.0, gt=0, description="truncation of the importance weight")


class DynamicSamplingConfig(Strict):
    enabled: bool = False
    oversample: float = Field(1.5, ge=1.0, description="sample this many times prompts_per_step groups; "
                                                      "train on the first prompts_per_step that carry signal")
    max_rounds: int = Field(3, ge=1, description="sample further rounds of fresh prompts until prompts_per_step "
                                                 "groups carry signal, at most this many rounds in all")


class ReplayConfig(Strict):
    ratio: float = Field(0.0, ge=0, lt=1, description="fraction of each batch's prompts drawn from stored hard examples")
    priority: Literal["reward_std", "disagreement"] = Field(
        "reward_std", description="reward_std: groups whose reward varied most; disagreement: completions whose "
                                  "log-probability ranked against their reward")
    window: int = Field(8, ge=1, description="how many past steps' shards to pick from")


class AlertRule(Strict):
    """One alert: `rule` compares the mean of a metric over the last `window` steps with `threshold`.

    Rules (docs/metrics.md): entropy_low, reward_std_low, kl_high, nonfinite_loss,
    length_collapse / length_explode (threshold is a ratio to the first step's mean length),
    reward_hacking (reward rose while eval/accuracy fell by more than `threshold`; the window
    counts eval points).
    """
    rule: Literal[tuple(RULES)]  # the rules registered in hindsight.lookback.alerts
    threshold: float = 0.0
    window: int = Field(1, ge=1, description="steps averaged (eval points for reward_hacking)")
    action: Literal["warn", "stop", "lower_lr"] = "warn"
    factor: float = Field(0.5, gt=0, lt=1, description="lower_lr multiplies the learning rate by this")


def default_alerts() -> list[AlertRule]:
    return [AlertRule(rule="nonfinite_loss", action="stop"),
            AlertRule(rule="entropy_low", threshold=0.05, window=3),
            AlertRule(rule="reward_std_low", threshold=1e-3, window=5),
            AlertRule(rule="kl_high", threshold=1.0, window=2),
            AlertRule(rule="length_collapse", threshold=0.25, window=3),
            AlertRule(rule="length_explode", threshold=4.0, window=3),
            AlertRule(rule="reward_hacking", threshold=0.05)]


class RLConfig(Strict):
    """The RL stage. Each registered algorithm's settings sit under `rl.<its name>` (for example
    `rl.ppo.lam`), validated by the algorithm's own model (`hindsight.learning.algorithms`)."""
    model_config = ConfigDict(extra="allow", validate_assignment=True)  # `allow` only for those blocks: see _blocks

    init: str | None = Field(None, description="policy to start from; default models:/X-sft@latest")
    algorithm: str = Field("grpo", description="a registered algorithm: grpo, rloo, reinforce_pp, ppo, ...")
    steps: int = Field(40, ge=1)
    prompts_per_step: int = Field(16, ge=1)
    samples_per_prompt: int = Field(8, ge=1, description="group size; grpo and rloo need at least 2")
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
    micro_batch_tokens: int | None = Field(None, ge=1, description="padded tokens (rows x (prompt + completion)) per "
                                           "forward and backward; gradients accumulate over a mini-batch's "
                                           "micro-batches. Also bounds the behaviour, reference and critic forwards. "
                                           "null: a mini-batch at once")
    max_grad_norm: float = Field(1.0, gt=0)
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight in the policy loss")
    disable_dropout: bool = Field(True, description="turn dropout off in the policy and critic, so the ratio is 1 "
                                                    "before the first update (false keeps the checkpoint's dropout)")
    kl: KLConfig = Field(default_factory=KLConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig, description="train a LoRA adapter on the policy (peft); "
                             "the reference is the base with the adapter off")
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    rewards: list[RewardFnConfig] = Field(default_factory=lambda: [RewardFnConfig(fn="rewards.exact:exact_answer")])
    reward_model_weight: float = Field(0.0, ge=0, description="weight of the learned reward; 0 skips it")
    reward_fallback: float = Field(0.0, description="score given when a reward function fails")
    reward_failure_stop: float = Field(1.0, gt=0, le=1, description="stop the run when one reward fails on at "
                                       "least this share of a step's completions (1.0: on every one); each step "
                                       "logs reward/failure_rate/<name>")
    reward_timeout_s: float = Field(60.0, gt=0, description="per call; a reward that overruns gets the fallback")
    reward_isolation: Literal["process", "inline"] = Field(
        "process", description="process: rewards run in a killable worker process; inline: in the trainer")
    eval_every: int = Field(10, ge=1)
    save_every: int = Field(10, ge=1, description="checkpoint weights, optimizer and RNG every N steps (and at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="weight versions kept; the newest complete one is never deleted")
    alerts: list[AlertRule] = Field(default_factory=default_alerts, description="[] turns every alert off")
    report_every: int = Field(10, ge=1, description="write an HTML rollout report every N steps (and at the end)")
    report_groups: int = Field(4, ge=1, description="prompt groups shown in each report")

    @model_validator(mode="wrap")
    @classmethod
    def _blocks(cls, data, handler):
        """Validate the algorithm blocks with their own models, and refuse any other unknown key,
        keeping every error's location (rl.ppo.lam) for the message."""
        if not isinstance(data, dict):
            return handler(data)
        known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        errors, blocks = [], {}
        for key, value in data.items():
            if key in known:
                continue
            if key not in ALGORITHMS:
                errors.append(InitErrorDetails(type="extra_forbidden", loc=(key,), input=value))
                continue
            try:
                blocks[key] = ALGORITHMS[key].Settings.model_validate(value or {})
            except ValidationError as exc:
                errors += [_relocated(err, key) for err in exc.errors()]
        try:
            model = handler({k: v for k, v in data.items() if k in known})
        except ValidationError as exc:
            errors = [_relocated(err) for err in exc.errors()] + errors
            model = None
        if model is not None:
            errors += _group_size_errors(model)
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        blocks.setdefault(model.algorithm, get_algorithm(model.algorithm).Settings())  # shown in MLflow params
        model.__pydantic_extra__.update(blocks)
        return model

    @field_validator("algorithm")
    @classmethod
    def _registered(cls, name: str) -> str:
        get_algorithm(name)  # ValueError naming the registered ones
        return name

    @model_validator(mode="after")
    def _consistent(self):
        if not self.rewards and self.reward_model_weight == 0:
            raise ValueError("rl needs at least one reward function or reward_model_weight > 0")
        if self.async_.max_staleness:
            # a further dynamic-sampling round needs the step's scores before sampling again, and
            # the Ray pool and the accelerate relaunch have their own samplers: not built for k >= 1
            for bad, why in ((self.dynamic_sampling.enabled, "dynamic_sampling.enabled"),
                             (self.workers.placement == "ray", "workers.placement: ray"),
                             (self.workers.rollout > 1, "workers.rollout > 1")):
                if bad:
                    raise ValueError(f"async.max_staleness >= 1 runs one sampler process; it does not combine with {why}")
        if self.mini_batch_size and self.mini_batch_size % self.samples_per_prompt:
            raise ValueError(f"mini_batch_size {self.mini_batch_size} must hold whole groups: a multiple of "
                             f"samples_per_prompt {self.samples_per_prompt}")
        if self.lora.enabled and (self.async_.max_staleness or self.workers.placement == "ray"):
            # the sampler process and the Ray actors load plain weights: LoRA there is not built
            raise ValueError("lora.enabled trains the adapter in the stage's process: it does not combine with "
                             "async.max_staleness >= 1 or workers.placement: ray yet")
        if self.lora.enabled and self.workers.learner_strategy == "fsdp2":
            raise ValueError("lora.enabled trains a replicated adapter: workers.learner_strategy: fsdp2 does not "
                             "shard one yet (use ddp, or train the full model under fsdp2)")
        return self

    def algorithm_settings(self):
        """The chosen algorithm's block (`rl.<algorithm>`), with its defaults when absent."""
        return self.__pydantic_extra__[self.algorithm]

    def needs_reward_model(self) -> bool:
        """The reward model is read for the reward, or to start a critic from."""
        return self.reward_model_weight > 0 or getattr(self.algorithm_settings(), "critic_init", None) == "reward_model"


def _group_size_errors(rl: RLConfig) -> list[InitErrorDetails]:
    algo, size = get_algorithm(rl.algorithm), rl.samples_per_prompt
    if size >= algo.min_group_size:
        return []
    why = f"{rl.algorithm} {algo.group_size_reason or 'needs larger groups'}, so it needs at least {algo.min_group_size}"
    return [InitErrorDetails(type="value_error", loc=("samples_per_prompt",), input=size,
                             ctx={"error": ValueError(f"{why} (got {size})")})]


def _relocated(err: dict, *prefix) -> InitErrorDetails:
    return InitErrorDetails(type=err["type"], loc=(*prefix, *err["loc"]), input=err.get("input"), ctx=err.get("ctx", {}))
