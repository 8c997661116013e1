"""What a trajectory talks to between its model turns, one `Episode` per trajectory:
- `ToolEpisode`: TRL's contracts. Plain `tools=[fn]` functions, and/or one instance of an
  `environment_factory` class per trajectory: `reset(**row)` (None, or text appended to the user
  turn), its public methods as tools, and an optional `get_reward()` read when the trajectory
  ends. A turn without a tool call ends the trajectory.
- `GymEpisode`: a gym-style text environment: `reset(**row)` gives the first observation (or
  `(observation, info)`), `step(text)` answers each model turn with gymnasium's `(observation,
  reward, terminated, truncated, info)`; the observation is the next user turn and the rewards
  add up to the trajectory's environment reward. A `step` runs under the tools' timeout; one
  that raises or overruns ends the trajectory (its log line says why), never the step.
"""
from __future__ import annotations

import inspect
import logging

from hindsight.errors import ConfigError
from hindsight.rollout.multiturn.arguments import DEFAULT_LIMITS, Limits
from hindsight.rollout.multiturn.tools import Toolbox, environment_tools, within

log = logging.getLogger("hindsight")


class Episode:
    toolbox: Toolbox = Toolbox([])

    def start(self, row: dict) -> str | None:
        return None

    def respond(self, text: str, calls, last: bool = False) -> tuple[list[dict], list, bool]:
        """(messages for the next turn, tool results, done) after a model turn; `last`: no turn
        can follow (max_turns), so nothing is run that no turn would read."""
        raise NotImplementedError

    def reward(self) -> float | None:
        return None


def _reset(env, row: dict):
    """env.reset(**row) as TRL calls it (every column, the prompt included), less what a `reset`
    that names its parameters does not take: TRL's own IncrementEnv declares `reset(self)`."""
    kwargs = {k: v for k, v in row.items() if k not in ("id", "_replayed")}
    params = inspect.signature(env.reset).parameters.values()
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        kwargs = {k: v for k, v in kwargs.items() if k in {p.name for p in params}}
    return env.reset(**kwargs)


class ToolEpisode(Episode):
    def __init__(self, tools: list, env=None, where: str = "", timeout_s: float = 10.0, max_calls: int = 8,
                 at_once: int = 4, limits: Limits = DEFAULT_LIMITS):
        self.env = env
        every = tools + (environment_tools(env, where, timeout_s, limits) if env is not None else [])
        self.toolbox = Toolbox(every, max_calls, at_once)
        if len(self.toolbox.tools) < len(every):
            names = [t.name for t in every]
            raise ConfigError(f"{where}: two tools share the name {next(n for n in names if names.count(n) > 1)!r}")

    def start(self, row: dict) -> str | None:
        return _reset(self.env, row) if self.env is not None else None

    def respond(self, text: str, calls, last: bool = False):
        if not calls:
            return [], [], True
        if last:  # the calls are cut by the turn limit: running them would change state no turn reads
            return [], [], False
        results = self.toolbox.call_all(calls)
        return [{"role": "tool", "name": r.name or "tool", "content": r.content} for r in results], results, False

    def reward(self) -> float | None:
        get = getattr(self.env, "get_reward", None)
        return float(get()) if callable(get) else None


class GymEpisode(Episode):
    def __init__(self, env, timeout_s: float = 10.0):
        self.env, self.total, self.timeout_s = env, 0.0, timeout_s

    def start(self, row: dict) -> str | None:
        first = _reset(self.env, row)
        return first[0] if isinstance(first, tuple) else first

    def respond(self, text: str, calls, last: bool = False):  # a last move still scores: the game steps
        try:
            observation, reward, terminated, truncated, _ = within(self.env.step, self.timeout_s, text)
            reward = float(reward)
        except Exception as exc:  # the environment's failure on the model's text ends the trajectory
            log.warning("%s.step: %s: %s; the trajectory ends there", type(self.env).__name__, type(exc).__name__,
                        str(exc)[:200])
            return [], [], True
        self.total += reward
        done = bool(terminated or truncated)
        return ([] if done else [{"role": "user", "content": str(observation)}]), [], done

    def reward(self) -> float | None:
        return self.total


def check_environment(factory, where: str, gym: bool = False) -> None:
    """Refuse, before any model loads, an environment class that cannot be one: no `reset`
    (TRL's rule), or for a gym-style one no `step`."""
    cls = factory if inspect.isclass(factory) else None
    probe = cls or type(factory())
    for method in ("reset",) + (("step",) if gym else ()):
        if not callable(getattr(probe, method, None)):
            raise ConfigError(f"{where}: {getattr(probe, '__name__', probe)} has no `{method}` method: "
                              + ("a gym-style environment needs reset(**row) and step(text)" if gym else
                                 "an environment_factory class needs reset(**row), as TRL's does"))
