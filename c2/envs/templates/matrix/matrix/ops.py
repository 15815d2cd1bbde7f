"""Matrix arithmetic."""

from matrix.core import Matrix

SINGULAR_EPS = 1e-12


def transpose(m: Matrix) -> Matrix:
    rows, cols = m.shape
    return Matrix([[m[i, j] for i in range(rows)] for j in range(cols)])


def matmul(a: Matrix, b: Matrix) -> Matrix:
    """The product a @ b."""
    (n, k), (k2, p) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"cannot multiply {a.shape} by {b.shape}")
    return Matrix([[sum(a[i, t] * b[t, j] for t in range(k)) for j in range(p)] for i in range(n)])


def trace(m: Matrix) -> float:
    rows, cols = m.shape
    if rows != cols:
        raise ValueError("trace needs a square matrix")
    return sum(m[i, i] for i in range(rows))


def determinant(m: Matrix) -> float:
    """Cofactor expansion along the first row."""
    n, cols = m.shape
    if n != cols:
        raise ValueError("determinant needs a square matrix")
    if n == 1:
        return m[0, 0]
    total = 0.0
    for j in range(n):
        minor = Matrix([row[:j] + row[j + 1 :] for row in m.rows[1:]])
        sign = -1 if j % 2 else 1
        total += sign * m[0, j] * determinant(minor)
    return total


def solve2(m: Matrix, rhs: list[float]) -> list[float]:
    """Solve the 2x2 system m @ x = rhs by Cramer's rule."""
    if m.shape != (2, 2) or len(rhs) != 2:
        raise ValueError("solve2 needs a 2x2 matrix and two right-hand sides")
    det = determinant(m)
    if abs(det) < SINGULAR_EPS:
        raise ValueError("singular system")
    x = (rhs[0] * m[1, 1] - m[0, 1] * rhs[1]) / det
    y = (m[0, 0] * rhs[1] - rhs[0] * m[1, 0]) / det
    return [x, y]
