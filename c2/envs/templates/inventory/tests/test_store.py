import pytest
from inventory.items import LOW_STOCK_THRESHOLD, Item
from inventory.store import Inventory


def make():
    inv = Inventory()
    inv.add(Item("b2", "nut", 0.5, LOW_STOCK_THRESHOLD + 20))
    inv.add(Item("a1", "bolt", 2.0, LOW_STOCK_THRESHOLD - 1))
    inv.add(Item("c3", "gear", 7.0, LOW_STOCK_THRESHOLD + 1))
    return inv


def test_add_and_get():
    inv = make()
    assert inv.get("a1").name == "bolt"
    assert len(inv) == 3


def test_duplicate_sku_rejected():
    inv = make()
    with pytest.raises(KeyError):
        inv.add(Item("a1", "other", 1.0))


def test_total_value():
    inv = make()
    expected = 0.5 * (LOW_STOCK_THRESHOLD + 20) + 2.0 * (LOW_STOCK_THRESHOLD - 1)
    expected += 7.0 * (LOW_STOCK_THRESHOLD + 1)
    assert inv.total_value() == pytest.approx(expected)


def test_low_stock_lists_only_low_items():
    inv = make()
    inv.add(Item("a0", "washer", 0.1, 0))
    assert inv.low_stock() == ["a0", "a1"]


def test_most_valuable_orders_by_value():
    t = LOW_STOCK_THRESHOLD
    values = {"b2": 0.5 * (t + 20), "a1": 2.0 * (t - 1), "c3": 7.0 * (t + 1)}
    assert make().most_valuable(2) == sorted(values, key=lambda s: (-values[s], s))[:2]


def test_most_valuable_ties_by_sku():
    inv = Inventory()
    inv.add(Item("z", "a", 1.0, 4))
    inv.add(Item("y", "b", 2.0, 2))
    inv.add(Item("x", "c", 0.5, 1))
    assert inv.most_valuable(3) == ["y", "z", "x"]


def test_fulfil_complete_order():
    inv = make()
    assert inv.fulfil({"b2": 5}) == {}
    assert inv.get("b2").quantity == LOW_STOCK_THRESHOLD + 15


def test_fulfil_reports_shortfall():
    inv = make()
    short = inv.fulfil({"a1": LOW_STOCK_THRESHOLD + 2, "c3": 1})
    assert short == {"a1": 3}
    assert inv.get("a1").quantity == 0
    assert inv.get("c3").quantity == LOW_STOCK_THRESHOLD


def test_fulfil_unknown_sku_is_short():
    assert make().fulfil({"zz": 4}) == {"zz": 4}
