import pytest
from cache.ttl import DEFAULT_TTL, ManualClock, TTLCache


def test_clock_advances():
    clock = ManualClock(5.0)
    clock.advance(2.5)
    assert clock() == 7.5


def test_clock_never_goes_back():
    with pytest.raises(ValueError):
        ManualClock().advance(-1)


def test_fresh_entry_is_returned():
    clock = ManualClock()
    c = TTLCache(clock)
    c.put("k", "v")
    clock.advance(DEFAULT_TTL / 2)
    assert c.get("k") == "v"


def test_entry_expires_at_ttl():
    clock = ManualClock()
    c = TTLCache(clock)
    c.put("k", "v")
    clock.advance(DEFAULT_TTL)
    assert c.get("k", "gone") == "gone"
    assert len(c) == 0


def test_purge_counts_expired_only():
    clock = ManualClock()
    c = TTLCache(clock, ttl=10)
    c.put("old", 1)
    clock.advance(6)
    c.put("new", 2)
    clock.advance(4)
    assert c.purge() == 1
    assert len(c) == 1 and c.get("new") == 2


def test_bad_ttl():
    with pytest.raises(ValueError):
        TTLCache(ManualClock(), ttl=0)
