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

This module is the design and the one place to import from: the trainer's side is
c2/rl/weight_publisher.py (`WeightPublisher`), the engine's side c2/rl/weight_subscriber.py
(`WeightSubscriber`) and its polling thread c2/rl/weight_fetcher.py (`BackgroundFetcher`), the
format both share c2/rl/weight_store.py and c2/rl/weight_shards.py.

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

# Every name of the weight store's modules, importable from here.
from c2.rl.weight_fetcher import BackgroundFetcher  # noqa: F401
from c2.rl.weight_publisher import Published, WeightPublisher  # noqa: F401
from c2.rl.weight_store import (  # noqa: F401
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
from c2.rl.weight_subscriber import LEASE_S, WeightSubscriber  # noqa: F401
