"""Versioned, delta-compressed, checksummed policy weights through object storage.

The trainer publishes every policy version it wants served; any number of inference workers
follow the store, with no collective between them. Only the serving dtype (bf16 by default) is
published: the trainer's float32 masters stay on the trainer, and the bits a worker serves are
exactly the bits that were published.

    pub = WeightPublisher("s3://bucket/run", full_every=16)      # on the trainer
    pub.publish(params, version=step)
    sub = WeightSubscriber("s3://bucket/run")                    # on each worker
    version, params = sub.fetch()                                # the newest complete version
    fetcher = sub.follow(engine)            # off-thread polling; the engine only swaps arrays in

Layout of the store (any tensorstore kvstore: a local path or `file://` by default, `s3://` and
`gs://` when scaled out; c2/rl/weight_store.py), versions zero-padded so that keys sort by version:

    blobs/000000000007/<tensor name>     one blob per tensor (its '/'-joined dict path)
    manifests/000000000007.json          the version's manifest, written after its blobs
    LATEST                               the newest version and its manifest's checksum, last
    subscribers/<id>.json                a lease: the version a subscriber holds, until when

A blob is zstd of the tensor's serving-dtype bits, byte planes first (all the first bytes of the
elements, then all the second bytes...: the high bytes of an XOR delta are nearly all zero). An
anchor (the first version a publisher writes, then every `full_every`-th) stores the bits
themselves; a delta stores their XOR with the bits of the version before it (`base_version`).
Applying a delta is one XOR, and a delta applied twice or out of order cannot pass the check.

The manifest names `version`, `base_version` (null for an anchor), the serving dtype and, per
tensor, name, shape, dtype, raw byte count, stored byte count, the checksum of the blob and the
checksum of the tensor's bits at this version (BLAKE2b-128). It is written after every blob, in one
atomic put, so a reader never sees a half-written version: blobs without a manifest are invisible.

A subscriber reaches version t from the version it holds (h) or from the newest anchor at or
before t, whichever is nearer: it walks t's chain of bases back until it meets h or an anchor,
then applies the deltas after it in order, each exactly once. Everything is decoded into new
arrays and checked before the held weights are replaced, so a bad store (`WeightSyncError`: a
checksum mismatch, a missing blob or manifest, a delta whose base it cannot reach, a version
older than the one held, a manifest for another model shape) leaves the held weights as they
were. A poll costs one read (LATEST) whatever the history, a fetch one read per manifest and
blob; no LIST on either path. `WeightPublisher.prune(keep=)` (the trainer calls it every
`config.rl.weight_store_prune_every` versions) deletes the versions before the newest anchor that
every live subscriber has reached (and that is no newer than the `keep` newest versions); a
subscriber's lease lapses `lease_s` after its last renewal, so a dead worker stops pinning.
Every store request has a deadline; a fetch that keeps failing ends the `BackgroundFetcher` with
an error naming the version.

S3: `s3://bucket/prefix` takes its endpoint from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL and its
region from AWS_REGION or AWS_DEFAULT_REGION (tensorstore reads neither itself); tensorstore
reads the credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE).
GCS: `gs://bucket/prefix` with tensorstore's usual Google credentials. A kvstore spec dict is
also accepted as the url.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zstandard

from c2.rl.weight_store import (  # noqa: F401  (the store's names, importable from here too)
    BLOBS,
    CODEC,
    FORMAT,
    KEEP_DTYPE,
    LATEST,
    MANIFESTS,
    SUBSCRIBERS,
    TIMEOUT_S,
    Bits,
    Url,
    WeightSyncError,
    _bits,
    _blob_prefix,
    _layout,
    _layout_diff,
    _manifest_key,
    _Store,
    checksum,
    decode,
    encode,
    flatten,
    kvstore_spec,
    serving_array,
    unflatten,
)

LEASE_S = 120.0  # a subscriber's lease; renewed every third of it while the subscriber lives


# The publisher ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Published:
    version: int
    base_version: int | None  # None: an anchor
    stored_bytes: int  # blobs written for this version
    full_bytes: int  # the model in the serving dtype
    seconds: float


class WeightPublisher:
    """Writes policy versions to the store (module doc). Options: full_every (an anchor every
    that many publications; the first is always one), dtype (the serving dtype of floating
    tensors; those named in `keep_dtype` keep theirs), level (zstd), threads (tensors encoded
    and written concurrently)."""

    def __init__(
        self,
        url: Url,
        *,
        full_every: int = 16,
        dtype: str = "bfloat16",
        keep_dtype: Iterable[str] = KEEP_DTYPE,
        level: int = 3,
        threads: int = 8,
    ):
        if isinstance(full_every, bool) or not isinstance(full_every, int) or full_every < 1:
            raise ValueError(f"full_every={full_every!r}: expected an int >= 1")
        self.store = _Store(url)
        self.full_every = full_every
        self.dtype = jnp.dtype(dtype)
        self.keep_dtype = tuple(keep_dtype)
        self.level = level
        self._pool = concurrent.futures.ThreadPoolExecutor(threads)
        self._prev: Bits | None = None  # the bits of the last version this publisher wrote
        self._prev_version: int | None = None
        self._prev_layout: dict = {}
        self._since_anchor = 0

    def publish(self, params: Mapping[str, Any], version: int) -> Published:
        """Write `params` (cast to the serving dtype) as `version`: blobs, then the manifest."""
        t0 = time.perf_counter()
        version = self._check_version(version)
        arrays = {
            n: serving_array(n, x, self.dtype, self.keep_dtype) for n, x in flatten(params).items()
        }
        layout = {n: (x.shape, x.dtype.name) for n, x in arrays.items()}
        anchor = self._prev is None or self._since_anchor + 1 >= self.full_every
        if not anchor and (diff := _layout_diff(self._prev_layout, layout)):
            raise WeightSyncError(
                f"version {version}: the model changed shape since version "
                f"{self._prev_version}: {diff[1]}",
                version=version,
                tensor=diff[0],
            )
        base = None if anchor else self._prev
        entries = list(self._pool.map(lambda n: self._put(version, n, arrays[n], base), arrays))
        manifest = {
            "format": FORMAT,
            "version": version,
            "base_version": None if anchor else self._prev_version,
            "codec": CODEC,
            "dtype": self.dtype.name,
            "checksum": "blake2b-128",
            "created": time.time(),
            "tensors": entries,
        }
        raw = json.dumps(manifest).encode()
        self.store.write(_manifest_key(version), raw)
        self.store.write_latest(version, raw)  # after the manifest: it names a complete version
        self._prev = {n: _bits(x) for n, x in arrays.items()}
        self._prev_version, self._prev_layout = version, layout
        self._since_anchor = 0 if anchor else self._since_anchor + 1
        return Published(
            version,
            manifest["base_version"],
            sum(e["stored_bytes"] for e in entries),
            sum(e["bytes"] for e in entries),
            time.perf_counter() - t0,
        )

    def _check_version(self, version: int) -> int:
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
            raise ValueError(f"version={version!r}: expected an int >= 0")
        newest = self._prev_version
        if newest is None:  # a new publisher: one LIST for what the store holds
            versions = self.store.versions()
            newest = versions[-1] if versions else None
        if newest is not None and version <= newest:
            raise WeightSyncError(
                f"version {version}: the store already holds version {newest}; versions "
                "must increase",
                version=int(version),
            )
        return int(version)

    def _put(self, version: int, name: str, array: np.ndarray, base: Bits | None) -> dict:
        bits = _bits(array)
        blob = encode(bits, None if base is None else base[name], self.level)
        self.store.write(_blob_prefix(version) + name, blob)
        return {
            "name": name,
            "shape": list(array.shape),
            "dtype": array.dtype.name,
            "bytes": array.nbytes,
            "stored_bytes": len(blob),
            "blob_checksum": checksum(blob),
            "checksum": checksum(bits),
        }

    def prune(self, keep: int = 2, now: float | None = None) -> list[int]:
        """Delete the versions before the newest anchor that (a) every live subscriber (an
        unexpired lease) holds or has passed and (b) is no newer than the `keep` newest
        versions; returns them. One LIST of the manifests and one of the leases: off the
        subscribers' path, every `prune_every` publications on the trainer.

        Any subscriber at or after that anchor, and any new one, can still reach every kept
        version: each kept delta's chain ends at a kept anchor or at a version it holds. A
        subscriber that died without `close()` pins nothing once its lease expires (`now`:
        the wall-clock time leases are judged at, default the present).
        """
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ValueError(f"keep={keep!r}: expected an int >= 1")
        versions = self.store.versions()
        if not versions:
            return []
        floor = min([versions[-min(keep, len(versions))], *self.subscribers(now).values()])
        anchors = [
            v for v in versions if v <= floor and self.store.manifest(v)["base_version"] is None
        ]
        if not anchors:
            return []
        doomed = [v for v in versions if v < anchors[-1]]
        for v in doomed:  # the manifest first: a reader never sees a version without its blobs
            self.store.delete(_manifest_key(v))
            self.store.delete_prefix(_blob_prefix(v))
        return doomed

    def subscribers(self, now: float | None = None) -> dict[str, int]:
        """{subscriber id: the version it holds} of the unexpired leases in the store."""
        return self.store.leases(now)

    def close(self) -> None:
        self._pool.shutdown()


# The subscriber --------------------------------------------------------------------------------


class WeightSubscriber:
    """Reads policy versions from the store (module doc). `fetch` returns the params as a nested
    dict of jax arrays in the published dtypes (placed with `shardings`, a matching tree, when
    given; else on the default device). like: a params tree (arrays or ShapeDtypeStructs) whose
    names and shapes the store must have. register: hold a lease on the held version under
    `subscribers/<id>.json`, written at each fetch and renewed by `renew` (the fetcher calls it
    each poll) every third of `lease_s`, for `WeightPublisher.prune`. timeout_s: the deadline of
    one store request."""

    def __init__(
        self,
        url: Url,
        *,
        like: Mapping[str, Any] | None = None,
        shardings: Any = None,
        subscriber_id: str | None = None,
        register: bool = True,
        threads: int = 8,
        lease_s: float = LEASE_S,
        timeout_s: float = TIMEOUT_S,
    ):
        if not lease_s > 0:
            raise ValueError(f"lease_s={lease_s!r}: expected > 0")
        self.store = _Store(url, timeout_s)
        self.lease_s = lease_s
        self._lease_until = 0.0  # when the lease written last expires (0: none written)
        self._lease_version: int | None = None
        self._verified: tuple[bytes | None, int | None] = (b"", None)  # (raw LATEST, its version)
        self._manifest_cache: dict | None = None  # the manifest `latest_version` verified
        self.shardings = shardings
        self.id = subscriber_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.register = register
        self._shapes = (
            None if like is None else {n: tuple(x.shape) for n, x in flatten(like).items()}
        )
        self._pool = concurrent.futures.ThreadPoolExecutor(threads)
        self._lock = threading.Lock()
        self.version: int | None = None  # the version held
        self._held: Bits = {}
        self._dtypes: dict[str, np.dtype] = {}
        self._layout: dict | None = None
        self.last_applied: list[int] = []  # versions whose blobs the last fetch applied, in order
        self.stats = {"fetches": 0, "versions_applied": 0, "bytes_read": 0, "fetch_s": 0.0}

    def latest_version(self) -> int | None:
        """The newest complete version in the store, or None: one read of LATEST while it is
        unchanged. A new pointer is believed once the manifest it names matches its checksum;
        a missing or torn one, or one naming a manifest that is absent (pruned) or does not
        match, costs one LIST of the manifests instead, once per state of the pointer."""
        raw, pointer = self.store.read_latest()
        if raw == self._verified[0]:
            return self._verified[1]
        newest = None
        if pointer is not None:
            version, expect = pointer
            try:
                self._manifest_cache = self.store.manifest(version, expect=expect)
                newest = version
            except WeightSyncError:
                pass
        if newest is None:  # not trusted: find the newest manifest by listing
            versions = self.store.versions()
            newest = versions[-1] if versions else None
        self._verified = (raw, newest)
        return newest

    def renew(self) -> None:
        """Rewrite the lease when the held version changed or a third of it has passed."""
        if not self.register or self.version is None:
            return
        if self.version != self._lease_version or time.time() > self._lease_until - (
            2 * self.lease_s / 3
        ):
            self._lease_until = self.store.write_lease(self.id, self.version, self.lease_s)
            self._lease_version = self.version

    def fetch(self, version: int | None = None) -> tuple[int, dict]:
        """(version, params) of `version` (default: the newest complete one)."""
        with self._lock:
            t0 = time.perf_counter()
            target = self._target(version)
            if target != self.version:
                self._advance(target)
                self.stats["fetches"] += 1
                self.stats["fetch_s"] += time.perf_counter() - t0
            self.renew()
            return self.version, self._params()

    def close(self) -> None:
        """Give up the lease (so `prune` no longer keeps versions for this subscriber)."""
        if self.register:
            self.store.delete(f"{SUBSCRIBERS}{self.id}.json")
        self._pool.shutdown()

    def follow(self, engine, poll_s: float = 1.0) -> BackgroundFetcher:
        """Start a thread that hands each newer version to `engine.update_weights`."""
        return BackgroundFetcher(self, engine.update_weights, poll_s=poll_s).start()

    # Internals ------------------------------------------------------------------------------

    def _target(self, version: int | None) -> int:
        newest = self.latest_version() if version is None else None
        if version is None and newest is None:
            raise WeightSyncError(f"no complete version in {self.store.url}")
        target = newest if version is None else int(version)
        if self.version is not None and target < self.version:
            raise WeightSyncError(
                f"version {target} is older than version {self.version}, which this subscriber "
                "holds",
                version=target,
            )
        return target

    def _chain(self, target: int) -> list[dict]:
        """Manifests from the starting point (an anchor, or the version after the held one) to
        `target`, in the order they are applied: one read per manifest, no LIST."""
        chain = [self._manifest(target, None)]
        while (base := chain[-1]["base_version"]) is not None and base != self.version:
            v = chain[-1]["version"]
            if self.version is not None and base < self.version:
                raise WeightSyncError(
                    f"version {v}: a delta against version {base}, older than the held "
                    f"version {self.version}; no anchor reaches it",
                    version=v,
                )
            if base >= v:
                raise WeightSyncError(f"version {v}: base_version {base} is not older", version=v)
            chain.append(self._manifest(base, v))
        return chain[::-1]

    def _manifest(self, v: int, delta: int | None) -> dict:
        """Version v's manifest (the one `latest_version` verified, when it is that one); delta:
        the version whose base v is (None: v is the target)."""
        if self._manifest_cache is not None and self._manifest_cache["version"] == v:
            return self._manifest_cache
        try:
            return self.store.manifest(v)
        except WeightSyncError as e:
            if "no manifest" not in str(e):
                raise
            if delta is None:
                what = f"version {v}: not a complete version in {self.store.url}"
                raise WeightSyncError(f"{what} ({e})", version=v) from e
            held = "nothing" if self.version is None else f"version {self.version}"
            raise WeightSyncError(
                f"version {delta}: a delta against version {v}, which this subscriber does "
                f"not hold (it holds {held}) and the store does not have",
                version=delta,
            ) from e

    def _check_layout(self, m: dict) -> None:
        """The manifest's tensors are the held ones (names, shapes, dtypes), or `like`'s (names,
        shapes) before the first fetch."""
        got = _layout(m)
        want = self._layout
        if want is None and self._shapes is not None:
            got = {n: shape for n, (shape, _) in got.items()}
            want = self._shapes
        diff = None if want is None else _layout_diff(want, got)
        if diff:
            raise WeightSyncError(
                f"version {m['version']}: the manifest is for another model shape: {diff[1]}",
                version=m["version"],
                tensor=diff[0],
            )

    def _advance(self, target: int) -> None:
        chain = self._chain(target)
        for m in chain:
            self._check_layout(m)
        bits = dict(self._held) if chain[0]["base_version"] is not None else {}
        for m in chain:  # each step builds new arrays: the held ones are never written
            bits = self._apply(m, bits)
        self._held, self.version, self._layout = bits, target, _layout(chain[-1])
        self._dtypes = {n: jnp.dtype(dt) for n, (_, dt) in self._layout.items()}
        self.last_applied = [m["version"] for m in chain]
        self.stats["versions_applied"] += len(chain)

    def _apply(self, m: dict, base: Bits) -> Bits:
        tensors = list(self._pool.map(lambda t: self._tensor(m, t, base), m["tensors"]))
        self.stats["bytes_read"] += sum(t["stored_bytes"] for t in m["tensors"])
        return {t["name"]: x for t, x in zip(m["tensors"], tensors)}

    def _tensor(self, m: dict, t: dict, base: Bits) -> np.ndarray:
        """One tensor's bits at version m, from its blob (XOR its bits in `base` for a delta)."""
        v, name = m["version"], t["name"]

        def fail(what: str) -> WeightSyncError:
            return WeightSyncError(f"version {v}, tensor {name!r}: {what}", version=v, tensor=name)

        blob = self.store.read(_blob_prefix(v) + name)
        if blob is None:
            raise fail(f"blob missing at {_blob_prefix(v) + name}")
        if checksum(blob) != t["blob_checksum"]:
            raise fail("checksum mismatch of the stored blob (corrupt or overwritten)")
        like = np.empty(t["shape"], np.dtype(f"u{jnp.dtype(t['dtype']).itemsize}"))
        try:
            x = decode(blob, like)
        except (zstandard.ZstdError, ValueError) as e:
            raise fail(f"undecodable blob ({e})") from e
        if m["base_version"] is not None:
            x ^= base[name]
        if checksum(x) != t["checksum"]:
            raise fail(
                "checksum mismatch of the decoded bits"
                + ("" if m["base_version"] is None else f" (delta on version {m['base_version']})")
            )
        return x

    def _params(self) -> dict:
        arrays = {n: x.view(self._dtypes[n]) for n, x in self._held.items()}
        tree = unflatten(arrays)
        if self.shardings is None:
            return jax.device_put(tree)
        return jax.device_put(tree, self.shardings)


# Off the engine's critical path ---------------------------------------------------------------


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
