"""Ranking students by score."""

from dataclasses import dataclass

PASS_MARK = 50


@dataclass(frozen=True)
class Student:
    name: str
    score: float


def rank(scores: dict[str, float]) -> dict[str, int]:
    """Standard competition ranking: 1, 2, 2, 4 (highest score first)."""
    ordered = sorted(scores.items(), key=lambda kv: -kv[1])
    positions = {}
    for i, (name, score) in enumerate(ordered):
        if i > 0 and score == ordered[i - 1][1]:
            positions[name] = positions[ordered[i - 1][0]]
        else:
            positions[name] = i + 1
    return positions


def top_students(students: list[Student], k: int) -> list[str]:
    """Names of the k best students (ties by name)."""
    best = sorted(students, key=lambda s: (-s.score, s.name))
    return [s.name for s in best[:k]]


def passing(students: list[Student]) -> list[str]:
    """Names scoring at least PASS_MARK, alphabetical."""
    return sorted(s.name for s in students if s.score >= PASS_MARK)


def pass_rate(students: list[Student]) -> float:
    if not students:
        return 0.0
    return len(passing(students)) / len(students)
