"""The trainer's side of the weight store (c2/rl/weight_sync.py describes the design): each
process casts its shards of the policy to the serving dtype and writes them (an anchor, or a delta
per shard on its own last version), process 0 writes the manifest and LATEST once every process
has written its own, and `prune` deletes what no live subscriber and no kept version needs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from c2 import distributed
from c2.rl import weight_shards as shards
from c2.rl.weight_store import (
    CODEC,
    FORMAT,
    KEEP_DTYPE,
    Url,
    WeightSyncError,
    _bits,
    _blob_prefix,
    _layout_diff,
    _manifest_key,
    _Store,
    checksum,
    encode,
    flatten,
    serving_array,
    serving_dtype,
)


@dataclasses.dataclass(frozen=True)
class Published:
    version: int
    base_version: int | None  # None: an anchor
    stored_bytes: int  # blobs written for this version
    full_bytes: int  # the model in the serving dtype
    seconds: float


class WeightPublisher:
    """Writes policy versions to the store (c2/rl/weight_sync.py). Options: full_every (an anchor
    every that many publications; the first is always one), dtype (the serving dtype of floating
    tensors; those named in `keep_dtype` keep theirs), level (zstd), threads (shards encoded and
    written concurrently)."""

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
