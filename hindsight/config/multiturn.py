"""`rl.rollout.multi_turn`: rollouts that call tools or play an environment over several turns.
Present, it turns the rollout into trajectories (`hindsight.rollout.multiturn`)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from hindsight.config.base import Strict
from hindsight.rollout.multiturn.parsers import get_parser

BUILTIN_TOOLS = ("python",)


class MultiTurnConfig(Strict):
    tools: list[str] = Field(default_factory=list, description="TRL's tools: 'module:function' (type hints and a "
                             "docstring), or 'python', the built-in interpreter (always sandboxed)")
    environment: str | None = Field(None, description="TRL's environment_factory: 'module:Class', one instance a "
                                    "trajectory: reset(**row), its public methods as tools, optional get_reward()")
    gym: str | None = Field(None, description="a gym-style text environment 'module:Class': reset(**row) -> "
                            "observation, step(text) -> (observation, reward, terminated, truncated, info)")
    max_turns: int = Field(4, ge=1, description="model turns in a trajectory; more is cut (counted)")
    max_tokens: int = Field(256, ge=1, description="tokens after the first prompt, model and tool turns together")
    parser: str = Field("hermes", description="the tool-call format: hermes (ChatML/Qwen <tool_call> JSON), json")
    isolation: Literal["sandbox", "in_process"] = Field(
        "sandbox", description="sandbox: each call of a tool function in the code reward's bubblewrap sandbox "
                               "(its module must be self-contained); in_process: in the rollout worker, as TRL "
                               "does. Environment instances hold state and run in process")
    tool_timeout_s: float = Field(10.0, gt=0, description="a call past it is an error turn the model reads")
    concurrency: int = Field(8, ge=1, description="trajectories whose tools run at once")
    max_calls_per_turn: int = Field(8, ge=1, description="calls one model turn may make; each one past it is "
                                                         "answered with an error the model reads")
    calls_at_once: int = Field(4, ge=1, description="a turn's sandboxed calls run this many at a time (in-process "
                                                    "ones run in order: they share an environment's state)")
    argument_max_chars: int = Field(4096, ge=1, description="a call's string argument may be this long")
    argument_max_items: int = Field(256, ge=1, description="a call's list or object argument may hold this many")
    argument_max_abs: float = Field(1e9, gt=0, description="a call's number may be this large")
    sandbox: Literal["bwrap", "unsafe-local"] = "bwrap"
    memory_scope: Literal["tree", "process"] = "tree"

    @field_validator("parser")
    @classmethod
    def _known_parser(cls, name: str) -> str:
        get_parser(name)
        return name

    @field_validator("tools")
    @classmethod
    def _specs(cls, tools: list[str]) -> list[str]:
        for spec in tools:
            if spec not in BUILTIN_TOOLS and spec.count(":") != 1:
                raise ValueError(f"tool {spec!r}: expected 'module:function' or one of {', '.join(BUILTIN_TOOLS)}")
        return tools

    @model_validator(mode="after")
    def _one_source(self):
        if self.gym and (self.tools or self.environment):
            raise ValueError("a gym-style environment answers every turn itself: it takes no tools or "
                             "environment_factory beside it")
        if not (self.tools or self.environment or self.gym):
            raise ValueError("multi_turn needs tools, an environment or a gym environment")
        return self
