"""Small numeric helpers."""

import math

TOLERANCE = 1e-9
GRID = 0.5


def almost_equal(a: float, b: float) -> bool:
    return abs(a - b) <= TOLERANCE


def clamp(value: float, low: float, high: float) -> float:
    """Limit value to the closed range [low, high]."""
    if low > high:
        raise ValueError(f"empty range [{low}, {high}]")
    if value < low:
        return low
    if value > high:
        return high
    return value


def lerp(a: float, b: float, t: float) -> float:
    """The point a fraction t of the way from a to b."""
    return a + (b - a) * t


def snap(value: float) -> float:
    """Round to the nearest multiple of GRID, halves away from zero."""
    steps = abs(value) / GRID
    whole = math.floor(steps + 0.5)
    return math.copysign(whole * GRID, value)
