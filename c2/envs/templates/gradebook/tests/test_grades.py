import pytest
from gradebook.grades import MAX_SCORE, curve, letter, weighted_average


def test_weighted_average():
    assert weighted_average([80, 90], [1, 3]) == pytest.approx(87.5)


def test_weighted_average_unnormalised_weights():
    assert weighted_average([50, 70, 90], [2, 2, 2]) == pytest.approx(70)


def test_weighted_average_length_mismatch():
    with pytest.raises(ValueError):
        weighted_average([1, 2], [1])


def test_weighted_average_zero_weights():
    with pytest.raises(ValueError):
        weighted_average([1, 2], [0, 0])


def test_letter_boundaries():
    assert letter(90) == "A"
    assert letter(89.9) == "B"
    assert letter(80) == "B"
    assert letter(70) == "C"
    assert letter(60) == "D"
    assert letter(59.5) == "F"


def test_letter_extremes():
    assert letter(MAX_SCORE) == "A"
    assert letter(0) == "F"


def test_letter_out_of_range():
    with pytest.raises(ValueError):
        letter(MAX_SCORE + 1)
    with pytest.raises(ValueError):
        letter(-1)


def test_curve_shifts_to_target_mean():
    assert curve([40, 60], 60) == [50, 70]


def test_curve_clamps():
    out = curve([5, MAX_SCORE - 5], 60)
    assert out == [min(MAX_SCORE, max(0, 5 + 60 - MAX_SCORE / 2)), MAX_SCORE]


def test_curve_empty():
    assert curve([], 70) == []
