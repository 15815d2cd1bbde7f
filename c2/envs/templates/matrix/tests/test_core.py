import pytest
from matrix.core import Matrix, identity


def test_shape_and_indexing():
    m = Matrix([[1, 2, 3], [4, 5, 6]])
    assert m.shape == (2, 3)
    assert m[1, 2] == 6 and m[0, 1] == 2


def test_ragged_rows_rejected():
    with pytest.raises(ValueError):
        Matrix([[1, 2], [3]])


def test_column():
    assert Matrix([[1, 2], [3, 4], [5, 6]]).column(1) == [2, 4, 6]


def test_identity():
    assert identity(3) == Matrix([[1, 0, 0], [0, 1, 0], [0, 0, 1]])


def test_empty_matrix_shape():
    assert Matrix([]).shape == (0, 0)
