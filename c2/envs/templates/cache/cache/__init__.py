"""Bounded caches: least-recently-used eviction and time-to-live expiry."""
