"""Shards of the weight store (c2/rl/weight_sync.py): which slices of each tensor a process
writes, where each lives, which a reader needs, and how a device's slice is put back together.

A shard is one distinct slice of a tensor under the trainer's sharding, as `Index`
((start, stop) per dimension). Each is written once across processes: by the process holding
its replica 0 (`shard.replica_id == 0`). A tensor whose one shard is the whole of it keeps the
store's compact manifest entry (blob at `blobs/V/<name>`, checksums on the tensor); a sharded
tensor lists its shards (`shards`: index, bytes, stored_bytes, blob_checksum, checksum), each
blob at `blobs/V/<name>/<start>.<start>...` (a leaf name is never a prefix of another tensor's,
so the keys cannot collide). A reader with target shardings reads only the shards that overlap
the slices its own devices hold, and builds each device's slice from them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import numpy as np

Index = tuple[tuple[int, int], ...]  # (start, stop) per dimension


def full(shape: Iterable[int]) -> Index:
    return tuple((0, int(n)) for n in shape)


def as_index(slices: tuple, shape: tuple[int, ...]) -> Index:
    """A device's index (a tuple of slices, as jax gives them) as (start, stop) pairs."""
    slices = tuple(slices) + (slice(None),) * (len(shape) - len(slices))
    out = []
    for s, n in zip(slices, shape):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"a strided shard index {s} of a dimension of {n}")
        out.append((start, stop))
    return tuple(out)


def index_shape(index: Index) -> tuple[int, ...]:
    return tuple(b - a for a, b in index)


def index_slices(index: Index) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in index)


def overlap(a: Index, b: Index) -> Index | None:
    """The intersection of two slices (None: they share no element)."""
    out = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) else None


def describe(index: Index) -> str:
    """[0:8, 0:16]: a shard in an error message."""
    return "[" + ", ".join(f"{a}:{b}" for a, b in index) + "]"


def key(name: str, index: Index, shape: tuple[int, ...]) -> str:
    """The shard's key under its version's blob prefix."""
    if index == full(shape):
        return name
    return f"{name}/" + ".".join(str(a) for a, _ in index)


def local_shards(x: Any) -> list[tuple[Index, Any]]:
    """The shards of `x` this process writes: its addressable replica-0 shards of a jax Array
    that spans processes (each byte once across processes); otherwise (a host array, or one
    every process holds whole) the whole of it, from process 0 alone."""
    shape = tuple(x.shape)
    if isinstance(x, jax.Array) and (not x.is_fully_addressable or jax.process_count() == 1):
        mine = [s for s in x.addressable_shards if s.replica_id == 0]
        return [(as_index(s.index, shape), s.data) for s in mine]
    return [(full(shape), x)] if jax.process_index() == 0 else []


def grid(x: Any) -> tuple[Index, ...]:
    """Every distinct shard of `x` across processes (the same on every process)."""
    shape = tuple(x.shape)
    if isinstance(x, jax.Array) and (not x.is_fully_addressable or jax.process_count() == 1):
        indices = x.sharding.devices_indices_map(shape).values()
        return tuple(sorted({as_index(i, shape) for i in indices}))
    return (full(shape),)


# The manifest's entries -------------------------------------------------------------------------


def shards_of(t: Mapping) -> list[dict]:
    """A manifest tensor entry's shards (the compact entry of an unsharded tensor: one)."""
    if "shards" in t:
        return [dict(s, index=tuple(tuple(p) for p in s["index"])) for s in t["shards"]]
    keep = ("bytes", "stored_bytes", "blob_checksum", "checksum")
    return [dict({k: t[k] for k in keep}, index=full(t["shape"]))]


def tensor_entry(name: str, shape, dtype: str, shards: list[dict]) -> dict:
    """The manifest entry of one tensor from its shards' entries (compact when one is whole)."""
    entry = {"name": name, "shape": list(shape), "dtype": dtype}
    entry["bytes"] = sum(s["bytes"] for s in shards)
    entry["stored_bytes"] = sum(s["stored_bytes"] for s in shards)
    if len(shards) == 1 and tuple(shards[0]["index"]) == full(shape):
        return entry | {k: shards[0][k] for k in ("blob_checksum", "checksum")}
    ordered = sorted(shards, key=lambda s: tuple(s["index"]))
    return entry | {"shards": [dict(s, index=[list(p) for p in s["index"]]) for s in ordered]}


def tiling_error(shape, shards: list[dict]) -> str | None:
    """Why `shards` do not cover the tensor exactly once (None: they do): a shard outside it,
    one written twice, or elements no shard holds."""
    seen = set()
    for s in shards:
        index = tuple(tuple(p) for p in s["index"])
        if len(index) != len(shape) or any(not 0 <= a <= b <= n for (a, b), n in zip(index, shape)):
            return f"shard {describe(index)} lies outside the shape {list(shape)}"
        if index in seen:
            return f"shard {describe(index)} is listed twice"
        seen.add(index)
    covered = sum(math.prod(index_shape(i)) for i in seen)
    if covered != math.prod(shape):
        return f"its shards cover {covered} of its {math.prod(shape)} elements"
    return None


# A reader's side ------------------------------------------------------------------------------


def flat_shardings(shardings: Any, names: Iterable[str]) -> dict[str, jax.sharding.Sharding]:
    """{tensor name: target sharding}: one Sharding for every tensor, or a tree of them keyed
    like the params (a missing name is an error naming it)."""
    if isinstance(shardings, jax.sharding.Sharding):
        return dict.fromkeys(names, shardings)
    out = {}
    for name in names:
        node = shardings
        for part in name.split("/"):
            if not isinstance(node, Mapping) or part not in node:
                raise ValueError(f"shardings: no sharding for tensor {name!r}")
            node = node[part]
        if not isinstance(node, jax.sharding.Sharding):
            raise TypeError(f"shardings[{name!r}]: expected a jax Sharding, got {node!r}")
        out[name] = node
    return out


def targets(sharding: jax.sharding.Sharding | None, shape: tuple[int, ...]) -> tuple[Index, ...]:
    """The distinct slices of a tensor this process's devices hold under `sharding` (None: the
    whole tensor, for a host copy)."""
    if sharding is None:
        return (full(shape),)
    indices = sharding.addressable_devices_indices_map(tuple(shape)).values()
    return tuple(sorted({as_index(i, shape) for i in indices}))


def needed(shards: list[dict], regions: Iterable[Index]) -> list[dict]:
    """The shards that overlap any of `regions`."""
    regions = list(regions)
    return [s for s in shards if any(overlap(s["index"], r) for r in regions)]


def assemble(region: Index, pieces: Mapping[Index, np.ndarray], dtype) -> np.ndarray:
    """The slice `region` of a tensor from the held shards that overlap it; a ValueError where
    they leave part of it uncovered."""
    out = np.empty(index_shape(region), dtype)
    copied = 0
    for index, bits in pieces.items():
        if (common := overlap(index, region)) is None:
            continue
        src = tuple(slice(a - i0, b - i0) for (a, b), (i0, _) in zip(common, index))
        dst = tuple(slice(a - r0, b - r0) for (a, b), (r0, _) in zip(common, region))
        out[dst] = bits[src]
        copied += math.prod(index_shape(common))
    if copied != out.size:
        raise ValueError(f"the held shards cover {copied} of the {out.size} elements of {region}")
    return out
