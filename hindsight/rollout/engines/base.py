"""A rollout engine: what samples a rollout worker's groups. An engine is one class, registered
with `@register` in a file of this package and imported in `__init__`; from the registry come
the config's choice (`rl.rollout.backend` takes its name, `rl.rollout.<name>` holds its
`Settings`), the stage's preflight (`problem`) and the resume fingerprint (`not_sampling`: the
settings that change no sampled token).

An engine samples `group_size` completions of each prompt, group i from seeds[i], and returns
the batch the learner trains on (`Experience`): prompts left-padded, completions right-padded,
the behaviour log-probs of the sampled tokens. An engine whose log-probs are not the training
model's own forward (another kernel, another dtype) says so (`recompute_logprobs`): the worker
recomputes them with the training model, the ratio's anchor, and keeps the engine's for the
optional importance weight.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from hindsight.errors import ConfigError
from hindsight.registry import Registry


class EngineSettings(BaseModel):
    """An engine's own block under `rl.rollout.<name>`; unknown keys fail like everywhere else."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


@dataclass(frozen=True, kw_only=True)
class EngineContext:
    """What an engine is built from: the worker's policy and tokenizer, the rollout section and
    its own settings block, the run's seed, the folder the policy started from, and the
    token budget of a forward (`rl.forward.micro_batch_tokens`)."""
    policy: object
    tok: object
    rollout: object
    settings: EngineSettings | None
    seed: int
    init_path: str
    bucket_mb: float
    budget: int | None
    stop_ids: tuple[int, ...]


class Engine:
    name: ClassVar[str]
    Settings: ClassVar[type[EngineSettings] | None] = None
    batches_groups: ClassVar[bool] = False     # samples rollout.groups_per_batch groups in one call
    recompute_logprobs: ClassVar[bool] = True  # its log-probs are not the training model's forward
    not_sampling: ClassVar[tuple[str, ...]] = ()  # keys of its block that change no sampled token
    multi_turn: ClassVar[bool] = False         # implements continue_turns (rl.rollout.multi_turn)

    @classmethod
    def recomputes(cls, rollout) -> bool:
        """Whether, with the rollout section `rollout`, its log-probs are not the training model's
        forward (so the anchor is the learner's, and the correction's `auto` turns on)."""
        return cls.recompute_logprobs

    @classmethod
    def problem(cls) -> str | None:
        """Why it cannot run on this machine (a missing package or device), or None."""
        return None

    @classmethod
    def require(cls) -> None:
        problem = cls.problem()
        if problem:
            raise ConfigError(f"rl.rollout.backend: {cls.name} cannot run: {problem}")

    def __init__(self, ctx: EngineContext):
        self.ctx = ctx

    def load_weights(self, policy) -> dict[str, float] | None:
        """The policy moved (a new weights version): sample from `policy` from now on. An engine
        that holds its own copy returns what the push measured and checked (`publish/*`)."""
        raise NotImplementedError

    def sample(self, prompts: list, seeds: list[int], group_size: int):
        """`group_size` completions of each prompt, group i seeded by seeds[i] -> Experience."""
        raise NotImplementedError

    def continue_turns(self, ids, mask, gens: list, max_new_tokens: int, temperature: float, top_p: float,
                       stop_ids) -> tuple:
        """Multi-turn: continue each left-padded history of `ids` (N, L) by one model turn of up to
        `max_new_tokens`, row i drawing from gens[i], each row stopping at one of `stop_ids`.
        Returns (the new ids (N, T'), padded after a row's end, and their mask (N, T'))."""
        raise NotImplementedError(f"rl.rollout.backend: {self.name} cannot continue a trajectory turn by turn "
                                  f"(rl.rollout.multi_turn); use hf")

    def close(self) -> None:
        """Free what the engine holds (a GPU engine's memory)."""


ENGINES: Registry[type[Engine]] = Registry("rollout engine")
register, unregister, get_engine = ENGINES.register, ENGINES.remove, ENGINES.lookup
