"""From `rl.rollout.multi_turn` to what a rollout worker runs: the episode of each trajectory
(tools loaded and checked, the sandbox they run in) and the turn settings."""
from __future__ import annotations

import importlib

from hindsight.errors import ConfigError
from hindsight.rollout.multiturn.arguments import Limits
from hindsight.rollout.multiturn.episodes import GymEpisode, ToolEpisode, check_environment
from hindsight.rollout.multiturn.loop import TurnSettings
from hindsight.rollout.multiturn.tools import Tool

WHERE = "rl.rollout.multi_turn"


def load_target(spec: str, where: str):
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"{where}: {spec!r}: cannot import module {module_name!r} ({exc})") from None
    target = getattr(module, attr, None)
    if not callable(target):
        raise ConfigError(f"{where}: {spec!r}: module {module_name!r} has no function or class {attr!r}")
    return target


SANDBOX = "rewards.tools:ToolSandbox"  # found by name, as rewards are: the core does not import rewards


def limits_of(mt) -> Limits:
    return Limits(max_chars=mt.argument_max_chars, max_items=mt.argument_max_items, max_abs=mt.argument_max_abs)


def tools_of(mt) -> list[Tool]:
    box = load_target(SANDBOX, f"{WHERE}.isolation")(mode=mt.sandbox, timeout_s=mt.tool_timeout_s,
                                                      memory_scope=mt.memory_scope)
    tools, limits = [], limits_of(mt)
    for spec in mt.tools:
        if spec == "python":  # the program is what runs sandboxed; the call that starts it is ours
            tools.append(Tool(box.python_tool(mt.tool_timeout_s), f"{WHERE}.tools", "in_process",
                              mt.tool_timeout_s + 30.0, limits=limits))
        else:
            tools.append(Tool(load_target(spec, f"{WHERE}.tools"), f"{WHERE}.tools", mt.isolation, mt.tool_timeout_s,
                              box, limits))
    return tools


def episode_factory(mt):
    """A function that makes one trajectory's episode; checks everything before any model loads."""
    if mt.gym:
        cls = load_target(mt.gym, f"{WHERE}.gym")
        check_environment(cls, f"{WHERE}.gym", gym=True)
        return lambda: GymEpisode(cls(), mt.tool_timeout_s)
    tools = tools_of(mt)
    factory = load_target(mt.environment, f"{WHERE}.environment") if mt.environment else None
    if factory is not None:
        check_environment(factory, f"{WHERE}.environment")
    def episode():
        return ToolEpisode(tools, factory() if factory else None, f"{WHERE}.environment", mt.tool_timeout_s,
                           mt.max_calls_per_turn, mt.calls_at_once, limits_of(mt))

    episode()  # a probe: two tools of one name fail here, before any model loads
    return episode


def tool_schemas(mt) -> list[dict]:
    """The schemas the template renders into a trajectory's first prompt (none for a gym
    environment, which is offered no tools)."""
    return [] if mt.gym else episode_factory(mt)().toolbox.schemas


def turn_settings(rollout) -> TurnSettings:
    mt = rollout.multi_turn
    return TurnSettings(max_turns=mt.max_turns, max_tokens=mt.max_tokens, max_new_tokens=rollout.max_new_tokens,
                        temperature=rollout.temperature, top_p=rollout.top_p, parser=mt.parser,
                        concurrency=mt.concurrency)
