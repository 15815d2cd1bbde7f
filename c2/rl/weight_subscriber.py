"""The engine's side of the weight store (c2/rl/weight_sync.py describes the design): a
subscriber polls the pointer, walks a version's chain of deltas back to what it holds or to an
anchor, reads only the shards its devices need, checks every blob and every decoded tensor before
it replaces the held weights, and keeps a lease on the version it holds so that pruning spares it.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zstandard

from c2.rl import weight_shards as shards
from c2.rl.weight_fetcher import BackgroundFetcher
from c2.rl.weight_store import (
    SUBSCRIBERS,
    TIMEOUT_S,
    Url,
    WeightSyncError,
    _blob_prefix,
    _layout,
    _layout_diff,
    _Store,
    checksum,
    decode,
    flatten,
    unflatten,
)

LEASE_S = 120.0  # a subscriber's lease; renewed every third of it while the subscriber lives


class WeightSubscriber:
    """Reads policy versions from the store (c2/rl/weight_sync.py). `fetch` returns the params as a
    nested dict of jax arrays in the published dtypes: laid out by `shardings` (one Sharding, or a
    tree of them keyed like the params; the engine's layout, any mesh) when given, reading only the
    shards that overlap the slices this process's devices hold; else whole, on the default device.
    `stats["bytes_read"]` counts the blob bytes read (`raw_bytes_read` decoded), and `last_read`
    those of the last fetch. like: a params tree (arrays or ShapeDtypeStructs) whose names and
    shapes the store must have. register: hold a lease on the held version under
    `subscribers/<id>.json`, written at each fetch and renewed by `renew` (the fetcher calls it each
    poll) every third of `lease_s`, for `WeightPublisher.prune`. timeout_s: the deadline of one
    store request."""

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
        self._held: dict[str, dict[shards.Index, np.ndarray]] = {}  # name -> shard -> bits
        self._regions: dict[str, tuple[shards.Index, ...]] | None = None  # what _held covers
        self._dtypes: dict[str, np.dtype] = {}
        self._layout: dict | None = None
        self.last_applied: list[int] = []  # versions whose blobs the last fetch applied, in order
        self.stats = {
            "fetches": 0,
            "versions_applied": 0,
            "bytes_read": 0,
            "raw_bytes_read": 0,
            "fetch_s": 0.0,
        }
        self.last_read = {"bytes_read": 0, "raw_bytes_read": 0}
        # Told each version a fetch is about to read (a multi-host engine's leader posts it, so
        # that its followers read the same version meanwhile: c2/rl/fleet_gang.py).
        self.on_fetch: Callable[[int], None] | None = None

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

    def fetch(self, version: int | None = None, shardings: Any = None) -> tuple[int, dict]:
        """(version, params) of `version` (default: the newest complete one), laid out by
        `shardings` (default: the subscriber's; None there too: whole, on the default device).
        A layout whose devices need other slices than those held reads from an anchor."""
        with self._lock:
            t0 = time.perf_counter()
            target = self._target(version)
            shardings = self.shardings if shardings is None else shardings
            m = None if target == self.version else self._manifest(target, None)
            regions = self._regions_of(_layout(m) if m else self._layout, shardings)
            self.last_read = {"bytes_read": 0, "raw_bytes_read": 0}
            if target != self.version or regions != self._regions:
                if self.on_fetch is not None and target != self.version:
                    self.on_fetch(target)
                self._advance(target, regions)
                self.stats["fetches"] += 1
                self.stats["fetch_s"] += time.perf_counter() - t0
            self.renew()
            return self.version, self._params(shardings)

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

    def _regions_of(self, layout: dict, shardings: Any) -> dict[str, tuple[shards.Index, ...]]:
        """{tensor: the distinct slices this process's devices hold under `shardings`} (None:
        the whole of each tensor)."""
        by_name = None if shardings is None else shards.flat_shardings(shardings, layout)
        return {
            n: shards.targets(None if by_name is None else by_name[n], shape)
            for n, (shape, _) in layout.items()
        }

    def _chain(self, target: int, held: int | None) -> list[dict]:
        """Manifests from the starting point (an anchor, or the version after `held`, the held
        version when its shards serve) to `target`, in the order they are applied: one read
        per manifest, no LIST."""
        chain = [self._manifest(target, None)]
        while (base := chain[-1]["base_version"]) is not None and base != held:
            v = chain[-1]["version"]
            if held is not None and base < held:
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

    def _advance(self, target: int, regions: dict) -> None:
        held = self.version if regions == self._regions else None  # else from an anchor
        chain = self._chain(target, held)
        for m in chain:
            self._check_layout(m)
            if diff := _layout_diff(_layout(chain[-1]), _layout(m)):
                raise WeightSyncError(
                    f"version {m['version']}: another model shape than version {target}, "
                    f"which it leads to: {diff[1]}",
                    version=m["version"],
                    tensor=diff[0],
                )
        bits = dict(self._held) if chain[0]["base_version"] is not None else {}
        for m in chain:  # each step builds new arrays: the held ones are never written
            bits = self._apply(m, bits, regions)
        self._held, self.version, self._layout = bits, target, _layout(chain[-1])
        self._regions = regions
        self._dtypes = {n: jnp.dtype(dt) for n, (_, dt) in self._layout.items()}
        self.last_applied = [m["version"] for m in chain]
        self.stats["versions_applied"] += len(chain)

    def _apply(self, m: dict, base: dict, regions: dict) -> dict:
        """Version m's shards that overlap `regions`, decoded (on `base` for a delta)."""
        jobs = [
            (t, piece)
            for t in m["tensors"]
            for piece in shards.needed(shards.shards_of(t), regions[t["name"]])
        ]
        done = list(self._pool.map(lambda job: self._shard(m, *job, base), jobs))
        out: dict[str, dict] = {}
        for (t, piece), (x, stored) in zip(jobs, done):
            out.setdefault(t["name"], {})[piece["index"]] = x
            for counts in (self.stats, self.last_read):
                counts["bytes_read"] += stored
                counts["raw_bytes_read"] += x.nbytes
        return out

    def _shard(self, m: dict, t: dict, piece: dict, base: dict) -> tuple[np.ndarray, int]:
        """One shard's bits at version m, from its blob (XOR the same shard in `base` for a
        delta), and the blob's size."""
        v, name, index, shape = m["version"], t["name"], piece["index"], tuple(t["shape"])
        where = "" if "shards" not in t else f" shard {shards.describe(index)}"

        def fail(what: str) -> WeightSyncError:
            return WeightSyncError(
                f"version {v}, tensor {name!r}{where}: {what}", version=v, tensor=name
            )

        key = _blob_prefix(v) + shards.key(name, index, shape)
        blob = self.store.read(key)
        if blob is None:
            raise fail(f"blob missing at {key}")
        if checksum(blob) != piece["blob_checksum"]:
            raise fail("checksum mismatch of the stored blob (corrupt or overwritten)")
        unsigned = np.dtype(f"u{jnp.dtype(t['dtype']).itemsize}")
        like = np.empty(shards.index_shape(index), unsigned)
        try:
            x = decode(blob, like)
        except (zstandard.ZstdError, ValueError) as e:
            raise fail(f"undecodable blob ({e})") from e
        if m["base_version"] is not None:
            prior = base.get(name, {}).get(index)
            if prior is None:
                raise fail(f"a delta on version {m['base_version']}, which has no such shard")
            x ^= prior
        if checksum(x) != piece["checksum"]:
            raise fail(
                "checksum mismatch of the decoded bits"
                + ("" if m["base_version"] is None else f" (delta on version {m['base_version']})")
            )
        return x, len(blob)

    def _params(self, shardings: Any) -> dict:
        """The held version as jax arrays: whole on the default device, or each device's
        slice (built from the held shards) under `shardings`."""
        layout = self._layout
        by_name = None if shardings is None else shards.flat_shardings(shardings, layout)
        arrays = {}
        for n, (shape, _) in layout.items():
            pieces, dtype = self._held[n], self._dtypes[n]
            if by_name is None:
                arrays[n] = self._slice(shards.full(shape), pieces, dtype)
            else:
                slice_of = lambda i, s=shape, p=pieces, d=dtype: self._slice(  # noqa: E731
                    shards.as_index(i, s), p, d
                )
                arrays[n] = jax.make_array_from_callback(shape, by_name[n], slice_of)
        tree = unflatten(arrays)
        return jax.device_put(tree) if by_name is None else tree

    @staticmethod
    def _slice(region: shards.Index, pieces: dict, dtype) -> np.ndarray:
        if region in pieces:  # a held shard as it is: no copy
            return pieces[region].view(dtype)
        return shards.assemble(region, pieces, pieces[next(iter(pieces))].dtype).view(dtype)
