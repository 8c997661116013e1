"""The RL stage's roles as plain classes: rollout workers sample groups, the learner trains.

They run in the stage's process (the default) or as Ray actors (`hindsight/roles/placement.py`);
the maths they call is the same either way, and none of it imports ray.
"""


def deal(items: list, n: int) -> list[list]:
    """Round-robin shares of `items` for n workers."""
    return [items[i::n] for i in range(n)]
