"""The weight store's format (c2/rl/weight_sync.py writes and reads it): keys, the pointer to
the newest version, subscribers' leases, the kvstore with a deadline on every request, and the
codec of one tensor.

    LATEST                               {"format", "version", "manifest_checksum"}: the newest
                                         complete version, written after its manifest
    manifests/000000000007.json          a version's manifest
    blobs/000000000007/<tensor name>     one blob per tensor, or per shard of a sharded one
                                         (`<tensor name>/<start>.<start>...`: weight_shards.py)
    subscribers/<id>.json                a lease: {"id", "version", "renewed", "expires"}

A poll reads only LATEST (one GET whatever the history); a reader checks the manifest it names
against its checksum and, where the pointer is missing, torn or names a manifest that does not
match, finds the newest manifest by one LIST instead. A lease pins the version its subscriber
holds until `expires` (wall-clock seconds: clocks must agree to well within a lease), so a
worker that dies without unregistering stops pinning old versions when its lease runs out.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts
import zstandard

FORMAT = 1
CODEC = "byteplanes+zstd"
MANIFESTS, BLOBS, SUBSCRIBERS, LATEST = "manifests/", "blobs/", "subscribers/", "LATEST"
# The model keeps its router (and balancing bias) in float32 whatever the param dtype
# (c2/model/params.py): published in float32 too, so routing matches the trainer's.
KEEP_DTYPE = ("router", "router_bias")
TIMEOUT_S = 60.0  # the deadline of one store request

Bits = dict[str, np.ndarray]  # tensor name -> its raw bits, an unsigned-int view
Url = str | os.PathLike | Mapping[str, Any]  # a path, file://, s3://, gs://, or a kvstore spec


class WeightSyncError(RuntimeError):
    """The store cannot give a valid version; `version` and `tensor` name what was wrong."""

    def __init__(self, message: str, *, version: int | None = None, tensor: str | None = None):
        super().__init__(message)
        self.version = version
        self.tensor = tensor


# The store ------------------------------------------------------------------------------------


def kvstore_spec(url: Url) -> dict:
    """A tensorstore kvstore spec for a local path, `file://`, `s3://` or `gs://` url."""
    if isinstance(url, Mapping):
        return dict(url)
    url = os.fspath(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "file", url
    if scheme == "file":
        return {"driver": "file", "path": os.path.abspath(rest).rstrip("/") + "/"}
    if scheme not in ("s3", "gs"):
        raise ValueError(f"weight store url {url!r}: expected a path, file://, s3:// or gs://")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"weight store url {url!r}: no bucket")
    spec = {"driver": "s3" if scheme == "s3" else "gcs", "bucket": bucket}
    if prefix.strip("/"):
        spec["path"] = prefix.strip("/") + "/"
    if scheme == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if endpoint:
            spec["endpoint"] = endpoint
            region = region or "us-east-1"
        if region:
            spec["aws_region"] = region
    return spec


class _Store:
    """The few kvstore operations the publisher and the subscriber need, synchronous, each with
    a deadline (`timeout_s`: a store that stops answering is an error, never a hang). `requests`
    counts them by kind ("read", "write", "list", "delete"), `bytes_read` the bytes reads
    returned."""

    def __init__(self, url: Url, timeout_s: float = TIMEOUT_S):
        self.url = json.dumps(dict(url)) if isinstance(url, Mapping) else os.fspath(url)
        self.kv = ts.KvStore.open(kvstore_spec(url)).result(timeout=timeout_s)
        self.timeout_s = timeout_s
        self.requests: collections.Counter = collections.Counter()
        self.bytes_read = 0

    def _wait(self, future: ts.Future, what: str):
        try:
            return future.result(timeout=self.timeout_s)
        except TimeoutError as e:
            raise TimeoutError(f"{what} in {self.url}: no answer in {self.timeout_s:g} s") from e

    def read(self, key: str) -> bytes | None:
        self.requests["read"] += 1
        r = self._wait(self.kv.read(key), f"reading {key}")
        if r.state != "value":
            return None
        self.bytes_read += len(r.value)
        return r.value

    def write(self, key: str, value: bytes) -> None:
        self.requests["write"] += 1
        self._wait(self.kv.write(key, value), f"writing {key}")

    def list(self, prefix: str) -> list[str]:
        self.requests["list"] += 1
        what = f"listing {prefix}"
        keys = self._wait(
            self.kv.list(_prefix_range(prefix), strip_prefix_length=len(prefix)), what
        )
        return sorted(k.decode() for k in keys)

    def delete(self, key: str) -> None:
        self.requests["delete"] += 1
        self._wait(self.kv.delete_range(ts.KvStore.KeyRange(key, key + "\0")), f"deleting {key}")

    def delete_prefix(self, prefix: str) -> None:
        self.requests["delete"] += 1
        self._wait(self.kv.delete_range(_prefix_range(prefix)), f"deleting {prefix}")

    def versions(self) -> list[int]:
        """Every version with a manifest (so complete), ascending: a LIST, off the hot path."""
        names = (n.removesuffix(".json") for n in self.list(MANIFESTS) if n.endswith(".json"))
        return sorted(int(n) for n in names if n.isdigit())

    # The pointer to the newest version ----------------------------------------------------

    def write_latest(self, version: int, manifest: bytes) -> None:
        """Point LATEST at `version` (after its manifest is written)."""
        pointer = {"format": FORMAT, "version": version, "manifest_checksum": checksum(manifest)}
        self.write(LATEST, json.dumps(pointer).encode())

    def read_latest(self) -> tuple[bytes | None, tuple[int, str] | None]:
        """(the raw pointer, (version, manifest checksum) or None where missing or torn)."""
        raw = self.read(LATEST)
        try:
            p = json.loads(raw)
            if p["format"] == FORMAT and isinstance(p["version"], int) and p["version"] >= 0:
                return raw, (p["version"], str(p["manifest_checksum"]))
        except (TypeError, ValueError, KeyError):
            pass
        return raw, None

    # Leases -------------------------------------------------------------------------------

    def write_lease(self, sub_id: str, version: int | None, lease_s: float) -> float:
        """Record that `sub_id` holds `version` until `lease_s` from now; returns that time."""
        now = time.time()
        lease = {"id": sub_id, "version": version, "renewed": now, "expires": now + lease_s}
        self.write(f"{SUBSCRIBERS}{sub_id}.json", json.dumps(lease).encode())
        return now + lease_s

    def leases(self, now: float | None = None) -> dict[str, int]:
        """{subscriber id: the version it holds} of the unexpired leases (a torn one is skipped:
        its subscriber rewrites it at its next renewal)."""
        now = time.time() if now is None else now
        out = {}
        for name in self.list(SUBSCRIBERS):
            try:
                lease = json.loads(self.read(SUBSCRIBERS + name))
                if lease["version"] is not None and float(lease["expires"]) > now:
                    out[str(lease["id"])] = int(lease["version"])
            except (TypeError, ValueError, KeyError):
                continue
        return out

    def manifest(self, version: int, expect: str | None = None) -> dict:
        """The manifest of `version`; `expect`: the checksum its bytes must have (the pointer's)."""
        raw = self.read(_manifest_key(version))
        if raw is None:
            raise WeightSyncError(
                f"version {version}: no manifest in {self.url} (never published, or pruned)",
                version=version,
            )
        if expect is not None and checksum(raw) != expect:
            raise WeightSyncError(
                f"version {version}: the manifest does not match the checksum LATEST gives",
                version=version,
            )
        try:
            m = json.loads(raw)
        except ValueError as e:
            raise WeightSyncError(
                f"version {version}: unreadable manifest ({e})", version=version
            ) from e
        if m.get("format") != FORMAT or m.get("version") != version:
            raise WeightSyncError(
                f"version {version}: manifest of format {m.get('format')} for version "
                f"{m.get('version')} (expected format {FORMAT}, version {version})",
                version=version,
            )
        return m


def _prefix_range(prefix: str) -> ts.KvStore.KeyRange:
    return ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))


def _manifest_key(version: int) -> str:
    return f"{MANIFESTS}{version:012d}.json"


def _blob_prefix(version: int) -> str:
    return f"{BLOBS}{version:012d}/"


# Tensors: names, serving dtype, bits, codec ----------------------------------------------------


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict of arrays -> {'/'-joined path: array}, in sorted key order."""
    out = {}
    for key in sorted(tree):
        if not isinstance(key, str) or "/" in key or not key:
            raise ValueError(f"params key {prefix}{key!r}: expected a non-empty str without '/'")
        value = tree[key]
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}/"))
        elif hasattr(value, "shape") and hasattr(value, "dtype"):
            out[prefix + key] = value
        else:
            raise TypeError(f"params {prefix}{key}: expected an array or a dict, got {value!r}")
    return out


def unflatten(flat: Mapping[str, Any]) -> dict:
    """The inverse of `flatten`."""
    tree: dict = {}
    for name, value in flat.items():
        *parents, leaf = name.split("/")
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def serving_dtype(name: str, dtype, served, keep: Iterable[str] = KEEP_DTYPE) -> np.dtype:
    """The dtype tensor `name` (of `dtype`) is served in: floating ones in `served`, except those
    whose last name component is in `keep`."""
    if jnp.issubdtype(dtype, jnp.floating) and name.rsplit("/", 1)[-1] not in keep:
        return jnp.dtype(served)
    return jnp.dtype(dtype)


def serving_array(name: str, x, dtype, keep: Iterable[str] = KEEP_DTYPE) -> np.ndarray:
    """`x` (a tensor or one shard of it) on the host as served (`serving_dtype`; cast on
    device: half the copy)."""
    if (served := serving_dtype(name, x.dtype, dtype, keep)) != x.dtype:
        x = x.astype(served)
    return np.ascontiguousarray(np.asarray(jax.device_get(x)))


def _bits(x: np.ndarray) -> np.ndarray:
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def checksum(bits: np.ndarray | bytes) -> str:
    data = bits if isinstance(bits, bytes) else np.ascontiguousarray(bits).view(np.uint8).data
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def encode(bits: np.ndarray, base: np.ndarray | None, level: int) -> bytes:
    """zstd of the byte planes of `bits` (XOR `base` for a delta)."""
    x = bits if base is None else bits ^ base
    planes = np.ascontiguousarray(x.reshape(-1).view(np.uint8).reshape(-1, x.itemsize).T)
    return zstandard.ZstdCompressor(level=level).compress(planes.data)


def decode(blob: bytes, like: np.ndarray) -> np.ndarray:
    """The array `encode` stored (still XOR-ed for a delta), shaped and typed as `like`."""
    raw = zstandard.ZstdDecompressor().decompress(blob, max_output_size=like.nbytes)
    planes = np.frombuffer(raw, np.uint8)
    if planes.size != like.nbytes:
        raise ValueError(f"decoded {planes.size} bytes, expected {like.nbytes}")
    x = planes.reshape(like.itemsize, -1).T.copy().view(like.dtype)  # a new, writable array
    return x.reshape(like.shape)


def _layout(manifest: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    return {t["name"]: (tuple(t["shape"]), t["dtype"]) for t in manifest["tensors"]}


def _describe(layout) -> str:
    """(shape, dtype) -> 'bfloat16[4, 8]'; a bare shape -> '[4, 8]'."""
    if layout and isinstance(layout[0], tuple):
        return f"{layout[1]}{list(layout[0])}"
    return str(list(layout))


def _layout_diff(want: Mapping, got: Mapping) -> tuple[str, str] | None:
    """(name, description) of the first tensor where two {name: (shape, dtype)} layouts differ."""
    for name in sorted(set(want) | set(got)):
        a, b = want.get(name), got.get(name)
        if a != b:
            what = lambda s: "absent" if s is None else _describe(s)
            return name, f"tensor {name!r} is {what(b)}, expected {what(a)}"
    return None
