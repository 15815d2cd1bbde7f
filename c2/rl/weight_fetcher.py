"""The weight store's follower: a thread that polls the store and hands each newer version to
the engine off its critical path, retrying a failing fetch, then giving up with an error naming
the version (c2/rl/weight_sync.py: `WeightSubscriber.follow`)."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from c2.rl.weight_store import WeightSyncError

if TYPE_CHECKING:
    from c2.rl.weight_sync import WeightSubscriber


class BackgroundFetcher:
    """A daemon thread that polls the store and, for each newer version, fetches and decodes it
    off-thread, then calls `update(params, version)` (e.g. `Engine.update_weights`, which only
    swaps the arrays in at its next step). A failed fetch is kept in `errors` and retried, the
    wait doubling from `poll_s` up to `max_backoff_s`; the held weights stay valid. After
    `max_failures` failures in a row (a bounded time: the sum of those waits and fetches) it
    stops, keeps a `WeightSyncError` naming the version in `fatal`, and hands it to
    `on_fatal(error)`: whoever waits for new weights learns that none will come."""

    def __init__(
        self,
        subscriber: WeightSubscriber,
        update: Callable[[dict, int], None],
        *,
        poll_s: float = 1.0,
        max_failures: int = 10,
        max_backoff_s: float = 5.0,
        on_fatal: Callable[[WeightSyncError], None] | None = None,
    ):
        if max_failures < 1:
            raise ValueError(f"max_failures={max_failures}: expected >= 1")
        self.subscriber = subscriber
        self.update = update
        self.poll_s = poll_s
        self.max_failures, self.max_backoff_s, self.on_fatal = max_failures, max_backoff_s, on_fatal
        self.errors: collections.deque[Exception] = collections.deque(maxlen=100)  # the last
        self.fatal: WeightSyncError | None = None
        self.delivered: list[int] = []  # versions handed to `update`, in order
        self._target: int | None = None  # the version the current poll fetches
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="weight-fetcher", daemon=True)

    def start(self) -> BackgroundFetcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> BackgroundFetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def wait_for(self, version: int, timeout: float | None = None) -> bool:
        """Block until a version >= `version` was delivered (True), or `timeout` passed or the
        fetcher gave up (False)."""
        reached = lambda: bool(self.delivered) and self.delivered[-1] >= version  # noqa: E731
        with self._changed:
            self._changed.wait_for(lambda: reached() or self.fatal is not None, timeout)
            return reached()

    def poll_once(self) -> int | None:
        """Fetch and deliver the newest version if it is newer than the held one."""
        self._target = None
        self.subscriber.renew()  # a live subscriber keeps its lease; a dead one lets it expire
        newest = self.subscriber.latest_version()
        held = self.subscriber.version
        if newest is None or (held is not None and newest <= held):
            return None
        self._target = newest
        version, params = self.subscriber.fetch(newest)
        self.update(params, version)
        with self._changed:
            self.delivered.append(version)
            self._changed.notify_all()
        return version

    def _run(self) -> None:
        failures, since = 0, 0.0
        while not self._stop.is_set():
            wait = self.poll_s
            try:
                self.poll_once()
                failures = 0
            except Exception as e:  # a bad version or a network error: retried, then fatal
                self.errors.append(e)
                failures += 1
                since = since if failures > 1 else time.monotonic()
                if failures >= self.max_failures:
                    self._give_up(e, failures, time.monotonic() - since)
                    return
                wait = min(self.poll_s * 2 ** (failures - 1), max(self.max_backoff_s, self.poll_s))
            self._stop.wait(wait)

    def _give_up(self, error: Exception, failures: int, seconds: float) -> None:
        version = getattr(error, "version", None)
        version = self._target if version is None else version
        self.fatal = WeightSyncError(
            f"fetching version {version} of {self.subscriber.store.url} failed {failures} times "
            f"in a row over {seconds:.1f} s (holding version {self.subscriber.version}); the "
            f"last error: {type(error).__name__}: {error}",
            version=version,
            tensor=getattr(error, "tensor", None),
        )
        self.fatal.__cause__ = error
        with self._changed:
            self._changed.notify_all()
        if self.on_fatal is not None:
            self.on_fatal(self.fatal)
