import pytest
from matrix.core import Matrix, identity
from matrix.ops import SINGULAR_EPS, determinant, matmul, solve2, trace, transpose


def test_transpose():
    assert transpose(Matrix([[1, 2, 3], [4, 5, 6]])) == Matrix([[1, 4], [2, 5], [3, 6]])


def test_matmul():
    a = Matrix([[1, 2], [3, 4]])
    b = Matrix([[5, 6, 7], [8, 9, 10]])
    assert matmul(a, b) == Matrix([[21, 24, 27], [47, 54, 61]])


def test_matmul_identity():
    a = Matrix([[2, -1], [0, 3]])
    assert matmul(a, identity(2)) == a and matmul(identity(2), a) == a


def test_matmul_shape_mismatch():
    with pytest.raises(ValueError):
        matmul(Matrix([[1, 2]]), Matrix([[1, 2]]))


def test_trace():
    assert trace(Matrix([[1, 9], [9, 4]])) == 5


def test_trace_non_square():
    with pytest.raises(ValueError):
        trace(Matrix([[1, 2]]))


def test_determinant_small():
    assert determinant(Matrix([[7]])) == 7
    assert determinant(Matrix([[1, 2], [3, 4]])) == -2


def test_determinant_3x3():
    assert determinant(Matrix([[2, 0, 1], [1, 3, 2], [1, 1, 2]])) == pytest.approx(6)


def test_determinant_non_square():
    with pytest.raises(ValueError):
        determinant(Matrix([[1, 2, 3], [4, 5, 6]]))


def test_solve2():
    assert solve2(Matrix([[2, 1], [1, 3]]), [3, 5]) == pytest.approx([0.8, 1.4])


def test_solve2_singular():
    with pytest.raises(ValueError):
        solve2(Matrix([[1, 2], [2, 4 + SINGULAR_EPS / 10]]), [1, 2])
