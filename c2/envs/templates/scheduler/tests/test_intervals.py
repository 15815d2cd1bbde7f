import pytest
from scheduler.intervals import Interval, merge, total_duration


def test_duration():
    assert Interval(30, 75).duration == 45


def test_rejects_backwards_interval():
    with pytest.raises(ValueError):
        Interval(10, 5)


def test_overlaps():
    assert Interval(0, 10).overlaps(Interval(5, 15))
    assert Interval(5, 15).overlaps(Interval(0, 10))
    assert Interval(0, 10).overlaps(Interval(2, 3))


def test_touching_does_not_overlap():
    assert not Interval(0, 10).overlaps(Interval(10, 20))
    assert not Interval(10, 20).overlaps(Interval(0, 10))


def test_clipped():
    assert Interval(0, 100).clipped(20, 50) == Interval(20, 50)
    assert Interval(0, 30).clipped(20, 50) == Interval(20, 30)
    assert Interval(0, 20).clipped(20, 50) is None


def test_merge_overlapping_and_touching():
    ivs = [Interval(50, 60), Interval(0, 10), Interval(5, 20), Interval(20, 30)]
    assert merge(ivs) == [Interval(0, 30), Interval(50, 60)]


def test_merge_keeps_disjoint_sorted():
    assert merge([Interval(40, 45), Interval(0, 5)]) == [Interval(0, 5), Interval(40, 45)]


def test_merge_nested():
    assert merge([Interval(0, 100), Interval(10, 20)]) == [Interval(0, 100)]


def test_merge_empty():
    assert merge([]) == []


def test_total_duration_counts_overlap_once():
    assert total_duration([Interval(0, 10), Interval(5, 15), Interval(30, 31)]) == 16
