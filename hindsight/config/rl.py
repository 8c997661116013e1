"""The RL section: its blocks by role (rollout, learner, scoring, workers), KL, async, dynamic
sampling, replay, alerts, and each registered algorithm's own block (`rl.<name>`)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_core import InitErrorDetails

from hindsight.config.base import Strict, raise_errors, with_blocks
from hindsight.config.data import LoraConfig
from hindsight.config.learner import LearnerConfig
from hindsight.config.legacy import move_deprecated
from hindsight.config.multiturn import MultiTurnConfig
from hindsight.config.scoring import RewardFnConfig, ScoringConfig  # noqa: F401  (re-exported)
from hindsight.learning.algorithms import ALGORITHMS, get_algorithm
from hindsight.learning.losses import get_loss
from hindsight.learning.strategies.catalogue import get_strategy
from hindsight.lookback.alerts import RULES
from hindsight.rollout.engines import ENGINES, get_engine
from hindsight.rollout.pools import POOLS, refusals


class RolloutConfig(Strict):
    """How rollouts are sampled. Each registered engine's own settings sit under
    `rl.rollout.<its name>` (for example `rl.rollout.vllm.gpu_memory_utilization`), validated
    by the engine's own model (`hindsight.rollout.engines`)."""
    model_config = ConfigDict(extra="allow", validate_assignment=True, allow_inf_nan=False)  # `allow` only for those blocks

    backend: str = Field("hf", description="a registered rollout engine: hf, hindsight's batched sampler on the "
                                           "policy in this process (CPU or GPU); vllm, a resident vLLM engine "
                                           "(optional extra, CUDA GPU)")
    max_new_tokens: int = Field(8, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    groups_per_batch: int = Field(8, ge=1, description="an engine that batches groups (hf) samples (and scores) this "
                                                       "many consecutive groups at once, one prefill per prompt. "
                                                       "Batches are fixed by group index and dealt whole, so a "
                                                       "group's samples never depend on the worker count; 1: each "
                                                       "group alone")
    publish_full_every: int = Field(100, ge=1, description="a new weights version reaches rollout workers in "
                                    "another process (Ray, the async sampler, a vLLM engine) as the elements that "
                                    "changed in their dtype, with a full copy every this many versions; 1: always full")
    multi_turn: MultiTurnConfig | None = Field(None, description="trajectories of several turns with tools or an "
                                               "environment (hf engine); absent: one completion a prompt")
    logprobs: Literal["forward", "decode", "learner"] = Field(
        "forward", description="the ratio's anchor: forward, one forward of the training model after decoding (the "
                               "same bits whatever the worker's thread count); decode (hf), read off the decoding "
                               "logits (one forward fewer; equal to ~1e-6, the same bits at one thread count); "
                               "learner, the update's own forward, when each batch is one optimizer step (no "
                               "forward before the update, as TRL with one iteration; the engine's log-probs are "
                               "kept for the correction and the gap)")

    @model_validator(mode="wrap")
    @classmethod
    def _engine_blocks(cls, data, handler):
        if not isinstance(data, dict):
            return handler(data)
        model, blocks, errors = with_blocks(cls, data, handler, ENGINES, lambda engine: engine.Settings)
        raise_errors(cls, errors)
        engine = ENGINES[model.backend]
        if model.multi_turn is not None and not engine.multi_turn:
            raise_errors(cls, [InitErrorDetails(type="value_error", loc=("multi_turn",), input=data.get("multi_turn"),
                                                ctx={"error": f"multi-turn rollouts run on an engine that samples "
                                                              f"turn by turn (hf), not {model.backend}"})])
        if engine.Settings is not None:
            blocks.setdefault(model.backend, engine.Settings())  # shown in MLflow params
        model.__pydantic_extra__.update(blocks)
        return model

    @field_validator("backend")
    @classmethod
    def _registered(cls, name: str) -> str:
        get_engine(name)  # ValueError naming the registered ones
        return name

    def code_specs(self) -> list[str]:
        """The multi-turn tools and environments a run's results depend on ('module:attr'), for
        its cache key: their source is hashed like a reward's."""
        mt = self.multi_turn
        if mt is None:
            return []
        return [t for t in mt.tools if ":" in t] + [x for x in (mt.environment, mt.gym) if x]

    def engine_settings(self, name: str | None = None):
        """The block of an engine (default the chosen one), or None for an engine without settings."""
        return self.__pydantic_extra__.get(name or self.backend)


class KLConfig(Strict):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)
    coef: float = Field(0.04, ge=0, description="the KL's weight (TRL's beta)")
    estimator: Literal["k1", "k2", "k3"] = Field("k3", description="Schulman's estimators; TRL's loss uses k3")
    bias_correction: bool = Field(False, description="in the loss, weight each token's KL by the policy ratio, so its "
                                  "gradient is the unbiased reverse-KL gradient off policy (DeepSeek-V3.2; TRL's "
                                  "use_bias_correction_kl, on by default there)")
    placement: Literal["loss", "reward"] = Field(
        "loss", alias="in", description="loss: a KL term in the policy loss; reward: a penalty folded into the reward")


class RoleResources(Strict):
    num_cpus: float = Field(0.5, ge=0)
    num_gpus: float = Field(0.0, ge=0)


class WorkersConfig(Strict):
    """Where the roles run. The learner group's size and strategy are the learner's own
    (`rl.learner.processes`, `rl.learner.strategy`)."""
    rollout: int = Field(1, ge=1, description="rollout workers; groups are seeded each on their own, so the "
                                              "count never changes what is sampled")
    scorer: int = Field(1, ge=1, description="scorers (reward functions, reference and reward model)")
    lease_ttl_s: float = Field(600.0, gt=0, description="a leased group not sealed by then (plus lease_s_per_token "
                                                      "a token of its budget) is issued again")
    lease_s_per_token: float = Field(0.05, ge=0, description="seconds a lease grows by per token of the work's "
                                     "budget (samples x max_new_tokens a group), so a long group is not taken for "
                                     "a hung one")
    heartbeat_s: float = Field(1.0, gt=0, description="how often a role in a process of its own says it is alive")
    silent_after_s: float = Field(30.0, gt=0, description="a role not heard from for this long is stopped or gone "
                                  "(SIGSTOP, a lost machine) and is replaced, with a stall report in rl/stalls/")
    collective_min_s: float = Field(60.0, gt=0, description="the least a learner collective waits for a peer "
                                    "once updates are measured (stall_factor x the median update, at least this); "
                                    "before the first, placement_timeout_s: a rank silent that long is rebuilt")
    stall_factor: float = Field(10.0, gt=1, description="a step's phase (rollout, score, update) running this many "
                                "times the median of its earlier ones fails, with a stall report in rl/stalls/")
    stall_min_s: float = Field(120.0, gt=0, description="the least time a phase is given before it counts as stalled")
    stall_first_s: float = Field(3600.0, gt=0, description="what a phase is given before any of its kind finished")
    replacements: int = Field(3, ge=0, description="async samplers a stage may replace, and learner groups it may "
                                                   "rebuild, after a stall; one more fails the stage with the reason")
    placement_timeout_s: float = Field(300.0, gt=0, description="an actor the Ray cluster has not placed and "
                                                               "started by then (its model loaded: minutes for a "
                                                               "7B model, and a loaded 2-core machine took over "
                                                               "60 s for a tiny one) is dropped (a line in the "
                                                               "log); the run keeps the workers it has")
    placement: str = Field(
        "local", description="a registered worker pool: local, the workers run in the stage's process (with "
                             "async.max_staleness >= 1, one sampler process beside it); ray, each is a Ray actor")
    resources: dict[Literal["rollout", "scorer", "learner"], RoleResources] = Field(
        default_factory=dict, description="what each Ray actor of a role reserves; default 0.5 CPU, no GPU (2 "
                                          "rollout workers and a scorer fit a 2-core laptop)")
    ray_address: str | None = Field(None, description="join this Ray cluster (else $RAY_ADDRESS, else an "
                                                      "embedded local one)")

    @field_validator("placement")
    @classmethod
    def _registered_pool(cls, name: str) -> str:
        return POOLS.check(name)  # ValueError naming the registered pools

    def of(self, role: str) -> RoleResources:
        return self.resources.get(role) or RoleResources()

    def needs(self, learners: int = 1) -> dict[str, float]:
        """What the whole layout reserves on the cluster (learner rank 0 is the stage's process)."""
        counts = {"rollout": self.rollout, "scorer": self.scorer, "learner": learners - 1}
        return {"CPU": sum(n * self.of(r).num_cpus for r, n in counts.items()),
                "GPU": sum(n * self.of(r).num_gpus for r, n in counts.items())}


class AsyncConfig(Strict):
    max_staleness: int = Field(0, ge=0, description="k: step s is sampled with weights version s - k (version 0 "
                                                    "for s < k), by a sampler process, while the learner trains "
                                                    "the k steps before it. 0: on-policy, sampling and learning "
                                                    "take turns")


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


class ForwardConfig(Strict):
    """The forwards outside the learner's step, which no backward follows: the rollout worker's
    behaviour log-probs and the scorer's reference log-probs and reward-model scores."""
    micro_batch_tokens: Annotated[int, Field(ge=1)] | Literal["learner"] | None = Field(
        "learner", description="padded tokens per forward of the rollout worker and the scorer; null: a batch at "
        "once; learner: rl.learner.micro_batch_tokens (with auto, the budget it fitted), which a forward without a "
        "backward always fits")
    packing: Literal["off", "on", "auto", "learner"] = Field(
        "learner", description="padding-free forwards for the rollout worker and the scorer (see "
                               "rl.learner.packing); learner: rl.learner.packing")


class RLConfig(Strict):
    """The RL stage. Each registered algorithm's settings sit under `rl.<its name>` (for example
    `rl.ppo.lam`), validated by the algorithm's own model (`hindsight.learning.algorithms`)."""
    model_config = ConfigDict(extra="allow", validate_assignment=True)  # `allow` only for those blocks: see _blocks

    init: str | None = Field(None, description="policy to start from; default models:/X-sft@latest")
    algorithm: str = Field("grpo", description="a registered algorithm: grpo, rloo, reinforce_pp, ppo, ...")
    steps: int = Field(40, ge=1)
    prompts_per_step: int = Field(16, ge=1)
    samples_per_prompt: int = Field(8, ge=1, description="group size; grpo and rloo need at least 2")
    kl: KLConfig = Field(default_factory=KLConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig, description="train a LoRA adapter on the policy (peft); "
                             "the reference is the base with the adapter off")
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    forward: ForwardConfig = Field(default_factory=ForwardConfig)
    scoring: ScoringConfig = Field(default_factory=ScoringConfig)
    eval_every: int = Field(10, ge=1)
    save_every: int = Field(10, ge=1, description="checkpoint weights, optimizer and RNG every N steps (and at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="weight versions kept; the newest complete one is never deleted")
    alerts: list[AlertRule] = Field(default_factory=default_alerts, description="[] turns every alert off")
    report_every: int = Field(10, ge=1, description="write an HTML rollout report every N steps (and at the end)")
    report_groups: int = Field(4, ge=1, description="prompt groups shown in each report")

    @model_validator(mode="wrap")
    @classmethod
    def _blocks(cls, data, handler):
        """Move deprecated keys to their blocks, then validate the algorithm blocks with their own
        models and refuse any other unknown key, keeping every error's location (rl.ppo.lam)."""
        if not isinstance(data, dict):
            return handler(data)
        data = move_deprecated(data)
        model, blocks, errors = with_blocks(cls, data, handler, ALGORITHMS, lambda algorithm: algorithm.Settings)
        if model is not None:
            errors += _group_size_errors(model)
        raise_errors(cls, errors)
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
        if not self.scoring.rewards and self.scoring.reward_model_weight == 0:
            raise ValueError("rl.scoring needs at least one reward function or reward_model_weight > 0")
        for refused in refusals(self):  # what the worker pool cannot do (its capabilities)
            raise ValueError(refused)
        errors = loss_combination_errors(get_algorithm(self.algorithm), self.learner)
        if errors:
            raise ValueError(errors[0])
        mini = self.learner.mini_batch_size
        if mini and mini % self.samples_per_prompt:
            raise ValueError(f"learner.mini_batch_size {mini} must hold whole groups: a multiple of "
                             f"samples_per_prompt {self.samples_per_prompt}")
        for error in anchor_errors(self):
            raise ValueError(error)
        if self.lora.enabled and not get_strategy(self.learner.strategy).trains_adapters:
            raise ValueError(f"lora.enabled trains a replicated adapter: learner.strategy: {self.learner.strategy} "
                             f"does not shard one yet (use ddp, or train the full model under {self.learner.strategy})")
        return self

    def forward_budget(self) -> tuple[int | None, str]:
        """(micro_batch_tokens, packing) of the rollout worker's and the scorer's forwards."""
        f, learner = self.forward, self.learner
        return (learner.micro_batch_tokens if f.micro_batch_tokens == "learner" else f.micro_batch_tokens,
                learner.packing if f.packing == "learner" else f.packing)

    def algorithm_settings(self):
        """The chosen algorithm's block (`rl.<algorithm>`), with its defaults when absent."""
        return self.__pydantic_extra__[self.algorithm]

    def needs_reward_model(self) -> bool:
        """The reward model is read for the reward, or to start a critic from."""
        return self.scoring.reward_model_weight > 0 or getattr(self.algorithm_settings(), "critic_init", None) == "reward_model"


def loss_combination_errors(algorithm, learner: LearnerConfig) -> list[str]:
    """The estimator x loss x correction combinations that make no sense, each one line."""
    loss, settings = get_loss(learner.loss), learner.loss_settings()
    out = []
    sequence = loss.sequence_objective or loss.ratio_level(settings) == "sequence"
    if sequence and algorithm.token_advantages:
        what = "scores whole sequences" if loss.sequence_objective else "takes one ratio per sequence (ratio_level)"
        out.append(f"rl.learner.loss: {learner.loss} {what}, and rl.algorithm: {algorithm.name} gives each token its "
                   f"own advantage: choose an outcome estimator (grpo, rloo) or a token-level loss")
    level = learner.correction.level
    if loss.correction_levels is not None and level not in ("auto", "none", *loss.correction_levels):
        out.append(f"rl.learner.correction.level: {level}: loss {learner.loss} takes the correction inside its maths "
                   f"at the {' or '.join(loss.correction_levels)} level only")
    return out


def anchor_errors(rl: RLConfig) -> list[str]:
    """Where the anchor cannot be the update's own forward, or a sampling copy cannot serve."""
    from hindsight.rollout.engines.hf import copy_dtype

    out = []
    if rl.rollout.logprobs == "learner":
        batch, mini = rl.prompts_per_step * rl.samples_per_prompt, rl.learner.mini_batch_size
        if rl.learner.num_iterations > 1 or (mini and mini < batch):
            out.append(f"rollout.logprobs: learner takes the anchor from the update's forward, which is the behaviour "
                       f"policy's only in a batch's first optimizer step: it needs learner.num_iterations 1 and one "
                       f"mini-batch a step (learner.mini_batch_size {mini} < {batch} samples); use forward")
        if rl.async_.max_staleness >= 1 and rl.learner.correction.level == "none":
            out.append("rollout.logprobs: learner with async.max_staleness >= 1 anchors on the current weights, so "
                       "the staleness needs the correction: set learner.correction.level (auto, token, sequence)")
    dtype = copy_dtype(rl.rollout)
    if dtype is not None:
        if rl.rollout.logprobs == "decode":
            out.append(f"rollout.logprobs: decode would anchor the ratio on the {dtype} copy's own log-probs "
                       f"(rollout.hf.dtype: {dtype}): use forward or learner, which anchor on the float32 learner")
        if rl.rollout.multi_turn is not None:
            out.append(f"rollout.hf.dtype: {dtype} samples single turns; multi_turn samples the policy itself "
                       f"(dtype: policy)")
        if rl.lora.enabled:
            out.append(f"rollout.hf.dtype: {dtype} copies a full policy; a LoRA policy samples itself (dtype: policy)")
    return out


def _group_size_errors(rl: RLConfig) -> list[InitErrorDetails]:
    algo, size = get_algorithm(rl.algorithm), rl.samples_per_prompt
    if size >= algo.min_group_size:
        return []
    why = f"{rl.algorithm} {algo.group_size_reason or 'needs larger groups'}, so it needs at least {algo.min_group_size}"
    return [InitErrorDetails(type="value_error", loc=("samples_per_prompt",), input=size,
                             ctx={"error": ValueError(f"{why} (got {size})")})]

