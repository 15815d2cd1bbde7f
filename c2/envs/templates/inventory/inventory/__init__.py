"""Stock keeping: items, a store of them, and order pricing."""
