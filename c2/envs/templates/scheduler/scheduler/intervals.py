"""Half-open intervals [start, end) in minutes."""

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    start: int
    end: int

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval ends before it starts: [{self.start}, {self.end})")

    @property
    def duration(self) -> int:
        return self.end - self.start

    def overlaps(self, other: "Interval") -> bool:
        """True when the intervals share at least one minute (touching is not overlapping)."""
        return self.start < other.end and other.start < self.end

    def clipped(self, start: int, end: int) -> "Interval | None":
        """The part inside [start, end), or None when nothing is left."""
        lo, hi = max(self.start, start), min(self.end, end)
        if hi <= lo:
            return None
        return Interval(lo, hi)


def merge(intervals: list[Interval]) -> list[Interval]:
    """Union of intervals, sorted; overlapping or touching intervals become one."""
    merged: list[Interval] = []
    for iv in sorted(intervals):
        if merged and iv.start <= merged[-1].end:
            last = merged.pop()
            merged.append(Interval(last.start, max(last.end, iv.end)))
        else:
            merged.append(iv)
    return merged


def total_duration(intervals: list[Interval]) -> int:
    """Minutes covered by at least one interval."""
    return sum(iv.duration for iv in merge(intervals))
