import pytest
from matrix.core import Matrix
from matrix.stats import argmax_row, column_means, row_sums


def test_row_sums():
    assert row_sums(Matrix([[1, 2], [3, 4], [0, -1]])) == [3, 7, -1]


def test_column_means():
    assert column_means(Matrix([[1, 2], [3, 6]])) == pytest.approx([2, 4])


def test_column_means_empty():
    with pytest.raises(ValueError):
        column_means(Matrix([]))


def test_argmax_row():
    assert argmax_row(Matrix([[1, 1], [5, 0], [2, 2]])) == 1


def test_argmax_row_first_on_tie():
    assert argmax_row(Matrix([[2, 2], [1, 3], [4, 0]])) == 0


def test_argmax_row_negative_rows():
    assert argmax_row(Matrix([[-5, -1], [-2, -2], [-9, 0]])) == 1


def test_argmax_row_empty():
    with pytest.raises(ValueError):
        argmax_row(Matrix([]))
