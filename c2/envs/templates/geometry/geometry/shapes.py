"""Rectangles and polygons."""

import math
from dataclasses import dataclass

from geometry.vectors import Vector


@dataclass(frozen=True)
class Rect:
    left: float
    bottom: float
    width: float
    height: float

    def __post_init__(self) -> None:
        if self.width < 0 or self.height < 0:
            raise ValueError("width and height must be non-negative")

    def area(self) -> float:
        return self.width * self.height

    def contains(self, p: Vector) -> bool:
        """Points on the edges count as inside."""
        right, top = self.left + self.width, self.bottom + self.height
        return self.left <= p.x <= right and self.bottom <= p.y <= top

    def intersection(self, other: "Rect") -> "Rect | None":
        left = max(self.left, other.left)
        bottom = max(self.bottom, other.bottom)
        right = min(self.left + self.width, other.left + other.width)
        top = min(self.bottom + self.height, other.bottom + other.height)
        if right < left or top < bottom:
            return None
        return Rect(left, bottom, right - left, top - bottom)


def polygon_area(points: list[tuple[float, float]]) -> float:
    """Area of a simple polygon (shoelace formula), whatever its orientation."""
    if len(points) < 3:
        raise ValueError("a polygon needs at least three points")
    total = 0.0
    for i in range(len(points)):
        x1, y1 = points[i]
        x2, y2 = points[(i + 1) % len(points)]
        total += x1 * y2 - x2 * y1
    return abs(total) / 2


def perimeter(points: list[tuple[float, float]]) -> float:
    """Length of the closed path through the points."""
    if len(points) < 2:
        return 0.0
    length = 0.0
    for i in range(len(points)):
        x1, y1 = points[i - 1]
        x2, y2 = points[i]
        length += math.hypot(x2 - x1, y2 - y1)
    return length


def bounding_box(points: list[tuple[float, float]]) -> Rect:
    if not points:
        raise ValueError("no points")
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    return Rect(min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys))
