import pytest
from inventory.items import LOW_STOCK_THRESHOLD, Item


def test_value_is_price_times_quantity():
    assert Item("a1", "bolt", 0.25, 8).value() == pytest.approx(2.0)


def test_empty_item_is_worth_nothing():
    assert Item("a1", "bolt", 3.0).value() == 0


def test_is_low_below_threshold():
    assert Item("a1", "bolt", 1.0, LOW_STOCK_THRESHOLD - 1).is_low()


def test_not_low_at_threshold():
    assert not Item("a1", "bolt", 1.0, LOW_STOCK_THRESHOLD).is_low()


def test_restock_adds_units():
    item = Item("a1", "bolt", 1.0, 2)
    item.restock(5)
    assert item.quantity == 7


def test_restock_rejects_non_positive():
    with pytest.raises(ValueError):
        Item("a1", "bolt", 1.0).restock(0)


def test_take_within_stock():
    item = Item("a1", "bolt", 1.0, 6)
    assert item.take(4) == 4
    assert item.quantity == 2


def test_take_more_than_stock_takes_all():
    item = Item("a1", "bolt", 1.0, 3)
    assert item.take(10) == 3
    assert item.quantity == 0


def test_take_rejects_negative():
    with pytest.raises(ValueError):
        Item("a1", "bolt", 1.0, 3).take(-1)
