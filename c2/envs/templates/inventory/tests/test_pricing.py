import pytest
from inventory.pricing import (
    BULK_DISCOUNT,
    BULK_QUANTITY,
    TAX_RATE,
    cheapest_supplier,
    line_total,
    order_total,
    with_tax,
)


def test_line_total_without_discount():
    assert line_total(2.0, BULK_QUANTITY - 1) == pytest.approx(2.0 * (BULK_QUANTITY - 1))


def test_line_total_bulk_discount_at_threshold():
    expected = round(3.0 * BULK_QUANTITY * (1 - BULK_DISCOUNT), 2)
    assert line_total(3.0, BULK_QUANTITY) == pytest.approx(expected)


def test_line_total_zero_quantity():
    assert line_total(5.0, 0) == 0


def test_line_total_rejects_negative_quantity():
    with pytest.raises(ValueError):
        line_total(1.0, -2)


def test_with_tax():
    assert with_tax(100.0) == pytest.approx(round(100.0 * (1 + TAX_RATE), 2))


def test_order_total_sums_lines_then_taxes():
    lines = [(1.5, 2), (4.0, BULK_QUANTITY)]
    subtotal = 3.0 + round(4.0 * BULK_QUANTITY * (1 - BULK_DISCOUNT), 2)
    assert order_total(lines) == pytest.approx(round(subtotal * (1 + TAX_RATE), 2))


def test_cheapest_supplier():
    assert cheapest_supplier({"acme": 9.5, "bolts-r-us": 7.25, "coglin": 8.0}) == "bolts-r-us"


def test_cheapest_supplier_tie_goes_to_first_name():
    assert cheapest_supplier({"zeta": 3.0, "alpha": 3.0, "mid": 4.0}) == "alpha"


def test_cheapest_supplier_empty():
    with pytest.raises(ValueError):
        cheapest_supplier({})
