"""Order pricing: bulk discounts, tax, and supplier choice."""

BULK_QUANTITY = 10
BULK_DISCOUNT = 0.1
TAX_RATE = 0.2


def line_total(unit_price: float, quantity: int) -> float:
    """Price of one order line; lines of BULK_QUANTITY or more get BULK_DISCOUNT off."""
    if quantity < 0:
        raise ValueError(f"quantity must be non-negative, got {quantity}")
    subtotal = unit_price * quantity
    if quantity >= BULK_QUANTITY:
        subtotal -= subtotal * BULK_DISCOUNT
    return round(subtotal, 2)


def with_tax(amount: float) -> float:
    return round(amount * (1 + TAX_RATE), 2)


def order_total(lines: list[tuple[float, int]]) -> float:
    """Taxed total of (unit_price, quantity) lines."""
    return with_tax(sum(line_total(price, quantity) for price, quantity in lines))


def cheapest_supplier(quotes: dict[str, float]) -> str:
    """The supplier with the lowest quote; ties go to the alphabetically first."""
    if not quotes:
        raise ValueError("no quotes")
    best = None
    for supplier, price in sorted(quotes.items()):
        if best is None or price < quotes[best]:
            best = supplier
    return best
