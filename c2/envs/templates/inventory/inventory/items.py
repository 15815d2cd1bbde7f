"""A stock item: price, quantity on hand, and movements in and out."""

from dataclasses import dataclass

LOW_STOCK_THRESHOLD = 5


@dataclass
class Item:
    sku: str
    name: str
    unit_price: float
    quantity: int = 0

    def value(self) -> float:
        """What the units on hand are worth."""
        return self.unit_price * self.quantity

    def is_low(self) -> bool:
        """True when fewer than LOW_STOCK_THRESHOLD units are left."""
        return self.quantity < LOW_STOCK_THRESHOLD

    def restock(self, amount: int) -> None:
        if amount <= 0:
            raise ValueError(f"restock amount must be positive, got {amount}")
        self.quantity += amount

    def take(self, amount: int) -> int:
        """Remove up to `amount` units; return how many were actually taken."""
        if amount < 0:
            raise ValueError(f"take amount must be non-negative, got {amount}")
        taken = min(amount, self.quantity)
        self.quantity -= taken
        return taken
