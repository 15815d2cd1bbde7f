import pytest
from scheduler.calendar import DAY_MINUTES, MIN_SLOT, Calendar
from scheduler.intervals import Interval


def test_book_and_clash():
    cal = Calendar()
    cal.book(60, 120)
    with pytest.raises(ValueError):
        cal.book(90, 150)


def test_back_to_back_bookings_allowed():
    cal = Calendar()
    cal.book(60, 120)
    cal.book(120, 180)
    assert len(cal.bookings) == 2


def test_empty_booking_rejected():
    with pytest.raises(ValueError):
        Calendar().book(30, 30)


def test_cancel():
    cal = Calendar()
    cal.book(0, 30)
    assert cal.cancel(0)
    assert not cal.cancel(0)
    assert cal.bookings == []


def test_free_slots_between_and_after():
    cal = Calendar()
    cal.book(100, 200)
    cal.book(200 + MIN_SLOT, 400)
    assert cal.free_slots(0, 500) == [
        Interval(0, 100),
        Interval(200, 200 + MIN_SLOT),
        Interval(400, 500),
    ]


def test_free_slots_drop_short_gaps():
    cal = Calendar()
    cal.book(0, 100)
    cal.book(100 + MIN_SLOT - 1, 300)
    assert cal.free_slots(0, 300) == []


def test_free_slots_clip_bookings_to_window():
    cal = Calendar()
    cal.book(0, 150)
    cal.book(400, 600)
    assert cal.free_slots(100, 500) == [Interval(150, 400)]


def test_free_slots_whole_window_when_empty():
    assert Calendar().free_slots(10, 10 + MIN_SLOT) == [Interval(10, 10 + MIN_SLOT)]


def test_busiest_day():
    cal = Calendar()
    cal.book(60, 120)
    cal.book(DAY_MINUTES + 60, DAY_MINUTES + 200)
    cal.book(2 * DAY_MINUTES, 2 * DAY_MINUTES + 140)
    assert cal.busiest_day() == 1


def test_busiest_day_tie_and_empty():
    cal = Calendar()
    assert cal.busiest_day() is None
    cal.book(DAY_MINUTES, DAY_MINUTES + 30)
    cal.book(0, 30)
    assert cal.busiest_day() == 0
