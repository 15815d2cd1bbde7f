"""Entries that expire after a time-to-live, with an injectable clock."""

DEFAULT_TTL = 10.0


class ManualClock:
    """A clock the caller moves by hand (for tests and simulations)."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        self.now += seconds


class TTLCache:
    def __init__(self, clock, ttl: float = DEFAULT_TTL) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        self.clock = clock
        self.ttl = ttl
        self._data: dict = {}

    def put(self, key, value) -> None:
        self._data[key] = (value, self.clock())

    def get(self, key, default=None):
        """The value if it is younger than ttl; an expired entry is dropped."""
        if key not in self._data:
            return default
        value, stored = self._data[key]
        if self.clock() - stored >= self.ttl:
            del self._data[key]
            return default
        return value

    def purge(self) -> int:
        """Drop every expired entry; return how many were dropped."""
        now = self.clock()
        expired = [k for k, (_, stored) in self._data.items() if now - stored >= self.ttl]
        for k in expired:
            del self._data[k]
        return len(expired)

    def __len__(self) -> int:
        return len(self._data)
