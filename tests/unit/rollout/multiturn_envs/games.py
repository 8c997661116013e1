"""Environments written the way users write them for TRL or gymnasium, for the multi-turn tests."""
from __future__ import annotations


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def no_hints(a, b):
    """Add.

    Args:
        a: x
        b: y
    """
    return a + b


def no_docstring(a: int, b: int) -> int:
    return a + b


def explode(a: int) -> int:
    """Raise.

    Args:
        a: anything
    """
    raise ValueError(f"cannot take {a}")


def hang(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    import time

    time.sleep(seconds)
    return "woke"


class Counter:
    """TRL's environment_factory form: reset(**row), tool methods, get_reward()."""

    def __init__(self):
        self.count = 0
        self.target = 0

    def reset(self, **kwargs) -> str | None:
        self.count = 0
        self.target = int(kwargs.get("target", 3))
        return f" Reach {self.target}."

    def increment(self, step: int) -> int:
        """Increase the counter by a number.

        Args:
            step: How much to add.

        Returns:
            The new count.
        """
        self.count += step
        return self.count

    def get_reward(self) -> float:
        return 1.0 if self.count == self.target else 0.0


class NoReset:
    def increment(self, step: int) -> int:
        """Increase.

        Args:
            step: how much
        """
        return step


class GuessNumber:
    """Gym-style: the model guesses; the environment says higher or lower."""

    def reset(self, **kwargs):
        self.secret, self.turns = int(kwargs.get("secret", 5)), 0
        return "Guess my number between 0 and 9.", {}

    def step(self, text: str):
        self.turns += 1
        digits = [c for c in text if c.isdigit()]
        if digits and int(digits[0]) == self.secret:
            return "correct", 1.0, True, False, {}
        hint = "higher" if digits and int(digits[0]) < self.secret else "lower"
        return hint, 0.0, False, False, {}


class IncrementEnv:
    """TRL's own example (trl/demo_grpo_environment.py), unchanged."""

    def __init__(self):
        self._counter = 0

    def reset(self) -> None:
        self._counter = 0

    def increment(self, a: int) -> int:
        """
        Increment the integer by a specified value

        Args:
            a: The value to increment by

        Returns:
            The incremented integer.
        """
        self._counter += a
        return self._counter
