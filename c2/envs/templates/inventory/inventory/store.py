"""An inventory: items by sku, valuation, reorder lists and order fulfilment."""

from inventory.items import Item


class Inventory:
    def __init__(self) -> None:
        self._items: dict[str, Item] = {}

    def add(self, item: Item) -> None:
        if item.sku in self._items:
            raise KeyError(f"duplicate sku {item.sku}")
        self._items[item.sku] = item

    def get(self, sku: str) -> Item:
        return self._items[sku]

    def __len__(self) -> int:
        return len(self._items)

    def total_value(self) -> float:
        return sum(item.value() for item in self._items.values())

    def low_stock(self) -> list[str]:
        """Skus that need reordering, sorted."""
        return sorted(item.sku for item in self._items.values() if item.is_low())

    def most_valuable(self, k: int) -> list[str]:
        """The k skus with the highest stock value (ties: sku order)."""
        ranked = sorted(self._items.values(), key=lambda item: (-item.value(), item.sku))
        return [item.sku for item in ranked[:k]]

    def fulfil(self, order: dict[str, int]) -> dict[str, int]:
        """Take what the order asks for; return the shortfall per sku (only non-zero)."""
        short = {}
        for sku, wanted in order.items():
            if sku not in self._items:
                short[sku] = wanted
                continue
            missing = wanted - self._items[sku].take(wanted)
            if missing > 0:
                short[sku] = missing
        return short
