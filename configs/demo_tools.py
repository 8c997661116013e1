"""The tools and the environment of the multi-turn demos (configs/demo-tools.yaml and
configs/demo-guess.yaml), written as a user writes them for TRL: plain functions with type hints
and a docstring, and a gym-style class. Self-contained (standard library only), so the add tool
can run in the bubblewrap sandbox, which holds no project source."""
from __future__ import annotations


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class GuessNumber:
    """Guess a number from 0 to 9: each wrong guess is answered `higher` or `lower`. The reward
    is 1 for the right number, less a tenth for every turn taken before it."""

    def reset(self, **row):
        self.secret, self.turns = int(row["secret"]), 0
        return "Guess my number from 0 to 9."

    def step(self, text: str):
        self.turns += 1
        digits = [c for c in text if c.isdigit()]
        if digits and int(digits[0]) == self.secret:
            return "correct", 1.0 - 0.1 * (self.turns - 1), True, False, {}
        hint = "higher" if not digits or int(digits[0]) < self.secret else "lower"
        return hint, 0.0, False, False, {}
