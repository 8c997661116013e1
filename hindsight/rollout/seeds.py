"""The sampling seed of each group: a pure function of the run's seed, the step and the group, so a
resumed or reassigned group samples what it would have (and a trace can name its seed)."""


def group_seed(seed: int, step: int, group: int) -> int:
    return (seed * 1_000_003 + step) * 100_003 + group
