import math

import pytest
from geometry.vectors import Vector


def test_add_and_sub():
    assert Vector(1, 2) + Vector(3, -1) == Vector(4, 1)
    assert Vector(1, 2) - Vector(3, -1) == Vector(-2, 3)


def test_scaled():
    assert Vector(1.5, -2).scaled(2) == Vector(3.0, -4)


def test_dot():
    assert Vector(1, 2).dot(Vector(3, 4)) == 11


def test_cross_sign_gives_orientation():
    assert Vector(1, 0).cross(Vector(0, 1)) == 1
    assert Vector(0, 1).cross(Vector(1, 0)) == -1


def test_norm():
    assert Vector(3, 4).norm() == 5


def test_unit_has_length_one():
    u = Vector(3, -4).unit()
    assert math.isclose(u.norm(), 1.0)
    assert u == Vector(0.6, -0.8)


def test_unit_of_zero_vector():
    with pytest.raises(ValueError):
        Vector(0, 0).unit()


def test_perpendicular():
    assert Vector(2, 1).is_perpendicular(Vector(-1, 2))
    assert not Vector(2, 1).is_perpendicular(Vector(1, 2))
