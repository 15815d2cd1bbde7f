"""A dense matrix stored as a list of rows."""


class Matrix:
    def __init__(self, rows: list[list[float]]) -> None:
        if rows and any(len(r) != len(rows[0]) for r in rows):
            raise ValueError("rows must all have the same length")
        self.rows = [list(r) for r in rows]

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.rows), len(self.rows[0]) if self.rows else 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Matrix) and self.rows == other.rows

    def __getitem__(self, ij: tuple[int, int]) -> float:
        i, j = ij
        return self.rows[i][j]

    def column(self, j: int) -> list[float]:
        return [r[j] for r in self.rows]


def identity(n: int) -> Matrix:
    return Matrix([[1 if i == j else 0 for j in range(n)] for i in range(n)])
