import pytest
from cache.lru import DEFAULT_CAPACITY, LRUCache


def test_put_and_get():
    c = LRUCache(2)
    c.put("a", 1)
    assert c.get("a") == 1 and c.get("zz", "d") == "d"


def test_default_capacity():
    assert LRUCache().capacity == DEFAULT_CAPACITY


def test_bad_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_evicts_least_recently_used():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.get("a")
    c.put("c", 3)
    assert "b" not in c and "a" in c and "c" in c
    assert c.evictions == 1


def test_update_does_not_evict():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    assert len(c) == 2 and c.evictions == 0
    assert c.keys() == ["b", "a"] and c.get("a") == 10


def test_fill_to_capacity_without_eviction():
    c = LRUCache(DEFAULT_CAPACITY)
    for i in range(DEFAULT_CAPACITY):
        c.put(i, i)
    assert c.evictions == 0 and len(c) == DEFAULT_CAPACITY
    c.put("one more", 0)
    assert c.evictions == 1 and 0 not in c


def test_hit_rate():
    c = LRUCache(2)
    assert c.hit_rate() == 0.0
    c.put("a", 1)
    c.get("a")
    c.get("a")
    c.get("b")
    assert c.hit_rate() == pytest.approx(2 / 3)
