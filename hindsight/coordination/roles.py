"""Dealing work to the RL run's roles."""
from __future__ import annotations


def deal(items: list, n: int, unit=None) -> list[list]:
    """Round-robin shares of `items` for n workers; items with the same `unit(item)` (a sampling
    batch) stay together in one share."""
    if unit is None:
        return [items[i::n] for i in range(n)]
    units: dict = {}
    for item in items:
        units.setdefault(unit(item), []).append(item)
    return [[x for u in list(units.values())[i::n] for x in u] for i in range(n)]
