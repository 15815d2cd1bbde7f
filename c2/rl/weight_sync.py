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

    blobs/000000000007/<tensor name>     one blob per tensor (its '/'-joined dict path), or
                                         per shard of a sharded one (c2/rl/weight_shards.py)
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
checksum of the tensor's bits at this version (BLAKE2b-128); a sharded tensor lists those per
shard (its slice of the global array). It is written after every blob, in one atomic put, so a
reader never sees a half-written version: blobs without a manifest are invisible.

Shard by shard: `publish` takes jax Arrays on any mesh, spanning processes or not. Every
process writes only the distinct shards whose replica 0 it holds (each byte once; a delta per
shard against its own last version), then one small collective of the shards' entries (never the
weights) tells process 0 that all are written; it writes the manifest and LATEST. No process ever
holds more than its own shards. `fetch(shardings=)` (the engine's layout, any other mesh) reads
only the shards that overlap the slices this process's devices hold and builds each device's
slice from them.

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

import concurrent.futures
import dataclasses
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import zstandard

from c2 import distributed
from c2.rl import weight_shards as shards
from c2.rl.weight_fetcher import BackgroundFetcher
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
    serving_dtype,
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
    tensors; those named in `keep_dtype` keep theirs), level (zstd), threads (shards encoded
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
        # the bits of the shards this process wrote of the last version, by (name, index)
        self._prev: dict[tuple[str, shards.Index], np.ndarray] | None = None
        self._prev_version: int | None = None
        self._prev_layout: dict = {}
        self._prev_grids: dict = {}
        self._since_anchor = 0

    def publish(self, params: Mapping[str, Any], version: int) -> Published:
        """Write `params` (cast to the serving dtype) as `version`: this process's shards, then
        (process 0, once every process has written its own) the manifest and LATEST. With
        several processes every one calls it, at the same point: it ends in a collective of
        the shards' entries (never of the weights)."""
        t0 = time.perf_counter()
        version = self._check_version(version)
        flat = flatten(params)
        layout = {
            n: (tuple(x.shape), serving_dtype(n, x.dtype, self.dtype, self.keep_dtype).name)
            for n, x in flat.items()
        }
        grids = {n: shards.grid(x) for n, x in flat.items()}  # the same on every process
        anchor = self._prev is None or self._since_anchor + 1 >= self.full_every
        if not anchor and (diff := _layout_diff(self._prev_layout, layout)):
            raise WeightSyncError(
                f"version {version}: the model changed shape since version "
                f"{self._prev_version}: {diff[1]}",
                version=version,
                tensor=diff[0],
            )
        anchor = anchor or grids != self._prev_grids  # a new trainer layout: no shard-wise base
        base = None if anchor else self._prev
        pieces = [
            (n, tuple(y.shape), index, x)
            for n, y in flat.items()
            for index, x in shards.local_shards(y)
        ]
        try:
            written = list(self._pool.map(lambda p: self._put(version, *p, base), pieces))
            mine: Any = [entry for entry, _ in written]
        except Exception as e:  # every process must reach the collective, which then raises
            if jax.process_count() == 1:
                raise
            mine = f"process {jax.process_index()}: {type(e).__name__}: {e}"
        entries = self._everyone(version, mine)
        manifest = {
            "format": FORMAT,
            "version": version,
            "base_version": None if anchor else self._prev_version,
            "codec": CODEC,
            "dtype": self.dtype.name,
            "checksum": "blake2b-128",
            "created": time.time(),
            "tensors": self._tensors(version, layout, entries),
        }
        if jax.process_index() == 0:
            raw = json.dumps(manifest).encode()
            self.store.write(_manifest_key(version), raw)
            self.store.write_latest(version, raw)  # after the manifest: a complete version
        self._prev = {(e["name"], e["index"]): bits for e, bits in written}
        self._prev_version, self._prev_layout, self._prev_grids = version, layout, grids
        self._since_anchor = 0 if anchor else self._since_anchor + 1
        return Published(
            version,
            manifest["base_version"],
            sum(e["stored_bytes"] for e in entries),
            sum(e["bytes"] for e in entries),
            time.perf_counter() - t0,
        )

    def _everyone(self, version: int, mine: list[dict] | str) -> list[dict]:
        """Every process's shard entries (a collective); a process that failed fails all."""
        gathered = distributed.allgather(mine)
        if failed := [g for g in gathered if isinstance(g, str)]:
            raise WeightSyncError(
                f"version {version}: not published, a process failed to write its shards: "
                + "; ".join(failed),
                version=version,
            )
        return [e for entries in gathered for e in entries]

    def _tensors(self, version: int, layout: dict, entries: list[dict]) -> list[dict]:
        """The manifest's tensor entries; every tensor's shards must cover it exactly once."""
        by_name: dict[str, list[dict]] = {n: [] for n in layout}
        for e in entries:
            by_name[e["name"]].append(e)
        out = []
        for name, (shape, dtype) in layout.items():
            if why := shards.tiling_error(shape, by_name[name]):
                raise WeightSyncError(
                    f"version {version}, tensor {name!r}: not published: {why}",
                    version=version,
                    tensor=name,
                )
            keep = ("index", "bytes", "stored_bytes", "blob_checksum", "checksum")
            parts = [{k: e[k] for k in keep} for e in by_name[name]]
            out.append(shards.tensor_entry(name, shape, dtype, parts))
        return out

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

    def _put(
        self, version: int, name: str, shape: tuple, index: shards.Index, x, base: dict | None
    ) -> tuple[dict, np.ndarray]:
        """Encode and write one shard (a delta on the same shard of the last version)."""
        served = serving_array(name, x, self.dtype, self.keep_dtype)
        bits = _bits(served)
        prior = None if base is None else base.get((name, index))
        if base is not None and prior is None:
            raise WeightSyncError(
                f"version {version}, tensor {name!r}: shard {shards.describe(index)} was not "
                f"written by this process at version {self._prev_version}",
                version=version,
                tensor=name,
            )
        blob = encode(bits, prior, self.level)
        self.store.write(_blob_prefix(version) + shards.key(name, index, shape), blob)
        return {
            "name": name,
            "index": index,
            "bytes": served.nbytes,
            "stored_bytes": len(blob),
            "blob_checksum": checksum(blob),
            "checksum": checksum(bits),
        }, bits

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
    dict of jax arrays in the published dtypes: laid out by `shardings` (one Sharding, or a tree
    of them keyed like the params; the engine's layout, any mesh) when given, reading only the
    shards that overlap the slices this process's devices hold; else whole, on the default
    device. `stats["bytes_read"]` counts the blob bytes read (`raw_bytes_read` decoded), and
    `last_read` those of the last fetch. like: a params tree (arrays or ShapeDtypeStructs) whose
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
