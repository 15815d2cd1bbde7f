"""Row and column summaries."""

from matrix.core import Matrix


def row_sums(m: Matrix) -> list[float]:
    return [sum(r) for r in m.rows]


def column_means(m: Matrix) -> list[float]:
    rows, cols = m.shape
    if rows == 0:
        raise ValueError("no rows")
    return [sum(m.column(j)) / rows for j in range(cols)]


def argmax_row(m: Matrix) -> int:
    """Index of the row with the largest sum (the first one on ties)."""
    sums = row_sums(m)
    if not sums:
        raise ValueError("no rows")
    best = 0
    for i in range(1, len(sums)):
        if sums[i] > sums[best]:
            best = i
    return best
