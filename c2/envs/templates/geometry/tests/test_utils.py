import pytest
from geometry.utils import GRID, TOLERANCE, almost_equal, clamp, lerp, snap


def test_almost_equal_within_tolerance():
    assert almost_equal(1.0, 1.0 + TOLERANCE / 2)


def test_not_almost_equal_beyond_tolerance():
    assert not almost_equal(1.0, 1.0 + TOLERANCE * 4)


def test_clamp_inside():
    assert clamp(0.3, 0.0, 1.0) == 0.3


def test_clamp_below_and_above():
    assert clamp(-2.0, -1.0, 1.0) == -1.0
    assert clamp(5.0, -1.0, 1.0) == 1.0


def test_clamp_at_bounds():
    assert clamp(1.0, 0.0, 1.0) == 1.0
    assert clamp(0.0, 0.0, 1.0) == 0.0


def test_clamp_empty_range():
    with pytest.raises(ValueError):
        clamp(0.0, 2.0, 1.0)


def test_lerp_endpoints_and_middle():
    assert lerp(2.0, 6.0, 0.0) == 2.0
    assert lerp(2.0, 6.0, 1.0) == 6.0
    assert lerp(2.0, 6.0, 0.25) == 3.0


def test_snap_rounds_to_grid():
    assert snap(GRID * 3 + GRID * 0.4) == pytest.approx(GRID * 3)
    assert snap(GRID * 3 + GRID * 0.6) == pytest.approx(GRID * 4)


def test_snap_halves_away_from_zero():
    assert snap(GRID * 2.5) == pytest.approx(GRID * 3)
    assert snap(-GRID * 2.5) == pytest.approx(-GRID * 3)
