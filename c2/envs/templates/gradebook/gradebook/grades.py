"""Turning component scores into a grade."""

MAX_SCORE = 100
# (lowest score, letter), best first.
LETTERS = [(90, "A"), (80, "B"), (70, "C"), (60, "D")]


def weighted_average(scores: list[float], weights: list[float]) -> float:
    """Average of scores weighted by weights (which need not sum to one)."""
    if len(scores) != len(weights):
        raise ValueError(f"{len(scores)} scores but {len(weights)} weights")
    total = sum(weights)
    if total <= 0:
        raise ValueError("weights must have a positive sum")
    return sum(s * w for s, w in zip(scores, weights)) / total


def letter(score: float) -> str:
    """Letter for a score out of MAX_SCORE: A from 90, B from 80, ..., F below 60."""
    if score < 0 or score > MAX_SCORE:
        raise ValueError(f"score {score} is outside 0..{MAX_SCORE}")
    for lowest, grade in LETTERS:
        if score >= lowest:
            return grade
    return "F"


def curve(scores: list[float], target_mean: float) -> list[float]:
    """Shift all scores so their mean is target_mean, clamped to [0, MAX_SCORE]."""
    if not scores:
        return []
    shift = target_mean - sum(scores) / len(scores)
    return [min(MAX_SCORE, max(0.0, s + shift)) for s in scores]
