"""A calendar that refuses double bookings and finds free time."""

from scheduler.intervals import Interval, merge

MIN_SLOT = 15
DAY_MINUTES = 1440


class Calendar:
    def __init__(self) -> None:
        self.bookings: list[Interval] = []

    def book(self, start: int, end: int) -> Interval:
        """Add a booking; raises ValueError if it overlaps an existing one."""
        new = Interval(start, end)
        if new.duration == 0:
            raise ValueError("empty booking")
        for existing in self.bookings:
            if existing.overlaps(new):
                raise ValueError(f"{new} clashes with {existing}")
        self.bookings.append(new)
        return new

    def cancel(self, start: int) -> bool:
        """Remove the booking starting at `start`; False when there is none."""
        for i, b in enumerate(self.bookings):
            if b.start == start:
                del self.bookings[i]
                return True
        return False

    def free_slots(self, start: int, end: int) -> list[Interval]:
        """Gaps of at least MIN_SLOT minutes between bookings inside [start, end)."""
        inside = [c for b in self.bookings if (c := b.clipped(start, end)) is not None]
        slots = []
        cursor = start
        for busy in merge(inside):
            if busy.start - cursor >= MIN_SLOT:
                slots.append(Interval(cursor, busy.start))
            cursor = max(cursor, busy.end)
        if end - cursor >= MIN_SLOT:
            slots.append(Interval(cursor, end))
        return slots

    def busiest_day(self) -> int | None:
        """Index of the day (0-based) with the most booked minutes; earliest day on ties."""
        minutes: dict[int, int] = {}
        for b in self.bookings:
            day = b.start // DAY_MINUTES
            minutes[day] = minutes.get(day, 0) + b.duration
        if not minutes:
            return None
        return min(minutes, key=lambda d: (-minutes[d], d))
