"""Reward functions the RL tests name in their configs ("helpers:varied"); tests/ is on the
import path of the test process and, through it, of the Ray actors the tests start."""


def varied(completions, **_):
    """Not constant within a group, so every estimator sees a signal."""
    return [float(len(c) % 3) for c in completions]
