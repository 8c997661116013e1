"""A self-contained tool module: the sandbox gets this source alone (no project imports)."""


def divide(a: int, b: int) -> str:
    """Divide.

    Args:
        a: numerator
        b: denominator
    """
    return str(a // b)
