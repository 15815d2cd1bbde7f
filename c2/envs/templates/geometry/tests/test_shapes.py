import math

import pytest
from geometry.shapes import Rect, bounding_box, perimeter, polygon_area
from geometry.vectors import Vector


def test_rect_area():
    assert Rect(1, 1, 3, 2).area() == 6


def test_rect_rejects_negative_size():
    with pytest.raises(ValueError):
        Rect(0, 0, -1, 2)


def test_contains_inside_and_edges():
    r = Rect(0, 0, 2, 1)
    assert r.contains(Vector(1, 0.5))
    assert r.contains(Vector(2, 1))
    assert r.contains(Vector(0, 0))


def test_contains_outside():
    r = Rect(0, 0, 2, 1)
    assert not r.contains(Vector(2.1, 0.5))
    assert not r.contains(Vector(1, -0.1))


def test_intersection_overlap():
    assert Rect(0, 0, 4, 4).intersection(Rect(2, 1, 4, 2)) == Rect(2, 1, 2, 2)


def test_intersection_disjoint():
    assert Rect(0, 0, 1, 1).intersection(Rect(3, 3, 1, 1)) is None


def test_polygon_area_square_both_orientations():
    square = [(0, 0), (2, 0), (2, 2), (0, 2)]
    assert polygon_area(square) == 4
    assert polygon_area(square[::-1]) == 4


def test_polygon_area_triangle():
    assert polygon_area([(0, 0), (4, 0), (0, 3)]) == 6


def test_polygon_area_needs_three_points():
    with pytest.raises(ValueError):
        polygon_area([(0, 0), (1, 1)])


def test_perimeter_closes_the_path():
    assert perimeter([(0, 0), (3, 0), (3, 4)]) == pytest.approx(12)
    assert perimeter([(0, 0), (1, 0), (1, 1), (0, 1)]) == pytest.approx(4)


def test_perimeter_single_point():
    assert perimeter([(1, 1)]) == 0


def test_bounding_box():
    box = bounding_box([(1, 5), (-2, 3), (4, -1)])
    assert box == Rect(-2, -1, 6, 6)
    assert math.isclose(box.area(), 36)
