"""Two-dimensional vectors."""

import math
from dataclasses import dataclass

from geometry.utils import almost_equal


@dataclass(frozen=True)
class Vector:
    x: float
    y: float

    def __add__(self, other: "Vector") -> "Vector":
        return Vector(self.x + other.x, self.y + other.y)

    def __sub__(self, other: "Vector") -> "Vector":
        return Vector(self.x - other.x, self.y - other.y)

    def scaled(self, factor: float) -> "Vector":
        return Vector(self.x * factor, self.y * factor)

    def dot(self, other: "Vector") -> float:
        return self.x * other.x + self.y * other.y

    def cross(self, other: "Vector") -> float:
        """The z component of the 3-d cross product."""
        return self.x * other.y - self.y * other.x

    def norm(self) -> float:
        return math.sqrt(self.dot(self))

    def unit(self) -> "Vector":
        n = self.norm()
        if almost_equal(n, 0.0):
            raise ValueError("the zero vector has no direction")
        return Vector(self.x / n, self.y / n)

    def is_perpendicular(self, other: "Vector") -> bool:
        return almost_equal(self.dot(other), 0.0)
