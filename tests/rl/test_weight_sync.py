"""The weight store: bit-exact round trips through many deltas, anchors, exactly-once in-order
application, every kind of bad store (held weights untouched), invisible half-written versions,
pruning, the S3 protocol against a real server on the loopback, and a real engine following."""

import collections
import json
import re
import socket
import time

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts

from c2 import model
from c2.infer import Engine
from c2.rl import weight_sync as ws


def make_params(seed=0, d=16):
    """A small params tree with the model's naming: bf16-served matrices, a float32 router."""
    rng = np.random.default_rng(seed)
    f32 = lambda *shape: jnp.asarray(0.02 * rng.standard_normal(shape), jnp.float32)
    return {
        "embed": f32(32, d),
        "final_norm": jnp.ones((d,), jnp.float32),
        "layers": {
            "attn": {"wq": f32(2, d, d)},
            "mlp": {"router": f32(2, d, 4), "w_up": f32(4, 8)},
        },
        "count": jnp.arange(3, dtype=jnp.int32),
    }


def adam_like_steps(params, n, lr=1e-3, seed=1):
    """n successive float32 masters, each moved by lr * sign(noise) (Adam's first steps)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        params = jax.tree.map(
            lambda x: (
                x + lr * np.sign(rng.standard_normal(x.shape)).astype(x.dtype)
                if x.dtype == jnp.float32
                else x
            ),
            params,
        )
        out.append(params)
    return out


def served_bits(params, dtype=ml_dtypes.bfloat16):
    """{name: bits} of what must be published: floats in bf16 except the router and its bias."""
    out = {}
    for name, x in ws.flatten(params).items():
        x = np.asarray(x)
        if x.dtype == np.float32 and not name.endswith(("/router", "/router_bias")):
            x = x.astype(dtype)
        out[name] = x.view(np.dtype(f"u{x.itemsize}"))
    return out


def assert_holds(params_out, masters):
    got = {n: np.asarray(x) for n, x in ws.flatten(params_out).items()}
    want = served_bits(masters)
    assert set(got) == set(want)
    for n in want:
        chex.assert_trees_all_equal(got[n].view(want[n].dtype), want[n])


@pytest.fixture
def versions():
    return [make_params()] + adam_like_steps(make_params(), 9)


def publish_all(url, versions, full_every):
    pub = ws.WeightPublisher(url, full_every=full_every)
    reports = [pub.publish(p, v) for v, p in enumerate(versions)]
    return pub, reports


def test_round_trip_is_bit_exact_through_many_deltas(tmp_path, versions):
    pub, reports = publish_all(str(tmp_path), versions, full_every=4)
    assert [r.base_version for r in reports] == [None, 0, 1, 2, None, 4, 5, 6, None, 8]
    assert all(r.full_bytes == reports[0].full_bytes for r in reports)
    assert all(r.stored_bytes < r.full_bytes for r in reports[1:4])  # deltas are small
    sub = ws.WeightSubscriber(f"file://{tmp_path}", like=versions[0])
    for v, masters in enumerate(versions):
        got_v, params = sub.fetch(v)
        assert got_v == v and sub.last_applied == [v]
        assert_holds(params, masters)
    assert params["embed"].dtype == jnp.bfloat16 and params["count"].dtype == jnp.int32
    assert params["layers"]["mlp"]["router"].dtype == jnp.float32
    m = json.loads((tmp_path / "manifests" / f"{5:012d}.json").read_text())
    assert m["version"] == 5 and m["base_version"] == 4
    t = {e["name"]: e for e in m["tensors"]}["layers/attn/wq"]
    assert t["shape"] == [2, 16, 16] and t["dtype"] == "bfloat16" and t["bytes"] == 2 * 16 * 16 * 2
    assert {"stored_bytes", "checksum", "blob_checksum"} <= set(t)


@pytest.mark.parametrize(
    "full_every, held, target, applied",
    [
        (8, 3, 7, [4, 5, 6, 7]),  # deltas from the held version, each once, in order
        (4, 1, 6, [4, 5, 6]),  # an anchor after the held version is nearer: jump to it
        (4, None, 7, [4, 5, 6, 7]),  # nothing held: from the newest anchor before the target
        (4, 4, 4, []),  # already held: nothing applied
    ],
)
def test_applies_from_the_held_version_or_the_nearest_anchor(
    tmp_path, versions, full_every, held, target, applied
):
    publish_all(tmp_path, versions, full_every)
    sub = ws.WeightSubscriber(tmp_path)
    if held is not None:
        sub.fetch(held)
    sub.last_applied = []
    version, params = sub.fetch(target)
    assert version == target and sub.last_applied == applied
    assert_holds(params, versions[target])


def test_fetch_defaults_to_the_newest_complete_version(tmp_path, versions):
    pub = ws.WeightPublisher(tmp_path, full_every=4)
    sub = ws.WeightSubscriber(tmp_path)
    with pytest.raises(ws.WeightSyncError, match="no complete version"):
        sub.fetch()
    for v in range(3):
        pub.publish(versions[v], v)
    assert sub.latest_version() == 2 and sub.fetch()[0] == 2


def _corrupt_blob(root, version, tensor):
    path = root / "blobs" / f"{version:012d}" / tensor
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _edit_manifest(root, version, edit):
    path = root / "manifests" / f"{version:012d}.json"
    m = json.loads(path.read_text())
    edit(m)
    path.write_text(json.dumps(m))


def _wrong_checksum(m):
    for t in m["tensors"]:
        if t["name"] == "layers/attn/wq":
            t["checksum"] = "0" * 32


BAD_STORES = {
    "corrupt blob": (
        lambda root: _corrupt_blob(root, 6, "layers/attn/wq"),
        7,
        r"version 6, tensor 'layers/attn/wq': checksum mismatch of the stored blob",
    ),
    "wrong bits": (
        lambda root: _edit_manifest(root, 5, _wrong_checksum),
        7,
        r"version 5, tensor 'layers/attn/wq': checksum mismatch of the decoded bits",
    ),
    "missing blob": (
        lambda root: (root / "blobs" / f"{5:012d}" / "embed").unlink(),
        7,
        r"version 5, tensor 'embed': blob missing",
    ),
    "missing base": (
        lambda root: (root / "manifests" / f"{5:012d}.json").unlink(),
        7,
        r"version 6: a delta against version 5, which this subscriber does not hold "
        r"\(it holds version 3\)",
    ),
    "older than held": (lambda root: None, 2, r"version 2 is older than version 3"),
    "another shape": (
        lambda root: ws.WeightPublisher(root).publish(make_params(d=8), 10),
        10,
        r"version 10: the manifest is for another model shape: tensor 'embed' is "
        r"bfloat16\[32, 8\], expected bfloat16\[32, 16\]",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_STORES))
def test_a_bad_store_names_version_and_tensor_and_leaves_the_held_weights(tmp_path, versions, case):
    damage, target, message = BAD_STORES[case]
    publish_all(tmp_path, versions, full_every=8)
    sub = ws.WeightSubscriber(tmp_path)
    _, held = sub.fetch(3)
    held = jax.tree.map(np.array, held)
    damage(tmp_path)
    with pytest.raises(ws.WeightSyncError, match=message) as err:
        sub.fetch(target)
    assert err.value.version is not None
    assert sub.version == 3
    version, params = sub.fetch(3)  # the held weights, unchanged
    assert version == 3
    chex.assert_trees_all_equal(jax.tree.map(np.asarray, params), held)
    assert_holds(params, versions[3])


def test_like_rejects_a_store_of_another_model(tmp_path):
    ws.WeightPublisher(tmp_path).publish(make_params(d=8), 0)
    sub = ws.WeightSubscriber(tmp_path, like=make_params(d=16))
    with pytest.raises(ws.WeightSyncError, match=r"version 0: .*tensor 'embed' is \[32, 8\]"):
        sub.fetch()
    assert sub.version is None


def test_publisher_rejects_old_versions_and_shape_changes(tmp_path, versions):
    pub, _ = publish_all(tmp_path, versions[:3], full_every=8)
    with pytest.raises(ws.WeightSyncError, match="version 2: the store already holds version 2"):
        pub.publish(versions[3], 2)
    with pytest.raises(
        ws.WeightSyncError,
        match=r"version 3: the model changed shape since version 2: tensor .embed. is "
        r"bfloat16\[32, 8\], expected bfloat16\[32, 16\]",
    ) as err:
        pub.publish(make_params(d=8), 3)
    assert err.value.tensor == "embed"
    with pytest.raises(ValueError, match="full_every=0"):
        ws.WeightPublisher(tmp_path, full_every=0)


def test_a_half_written_version_is_invisible(tmp_path, versions, monkeypatch):
    pub, _ = publish_all(tmp_path, versions[:3], full_every=8)
    write = ws._Store.write

    def crash_at_the_manifest(self, key, value):
        if key.startswith(ws.MANIFESTS):
            raise OSError("the trainer died")
        return write(self, key, value)

    monkeypatch.setattr(ws._Store, "write", crash_at_the_manifest)
    with pytest.raises(OSError, match="the trainer died"):
        pub.publish(versions[3], 3)
    monkeypatch.undo()
    assert (tmp_path / "blobs" / f"{3:012d}" / "embed").exists()  # blobs written, no manifest
    sub = ws.WeightSubscriber(tmp_path)
    assert sub.latest_version() == 2
    assert sub.fetch()[0] == 2
    with pytest.raises(ws.WeightSyncError, match="version 3: not a complete version"):
        sub.fetch(3)


def test_prune_keeps_what_registered_subscribers_can_still_need(tmp_path, versions):
    pub, _ = publish_all(tmp_path, versions, full_every=3)  # anchors 0, 3, 6, 9
    a, b = ws.WeightSubscriber(tmp_path), ws.WeightSubscriber(tmp_path)
    a.fetch(4)
    b.fetch(7)
    assert pub.subscribers() == {a.id: 4, b.id: 7}
    assert pub.prune(keep=2) == [0, 1, 2]  # a holds 4: the newest anchor it passed is 3
    a.close()
    assert pub.prune(keep=2) == [3, 4, 5]  # b holds 7: anchor 6
    assert pub.prune(keep=2) == []
    assert ws.WeightSubscriber(tmp_path).latest_version() == 9
    assert not list((tmp_path / "blobs").glob(f"{5:012d}/*"))
    _, params = b.fetch(8)  # from the held version
    assert b.last_applied == [8]
    assert_holds(params, versions[8])
    new = ws.WeightSubscriber(tmp_path, register=False)
    new.fetch(8)
    assert new.last_applied == [6, 7, 8]
    b.close()
    assert pub.prune(keep=1) == [6, 7, 8]
    assert pub.prune(keep=5) == []


class CountingKv:
    """Forwards to a tensorstore kvstore and records each request as (kind, key); `hang` (a key
    prefix) gets a future that never resolves: a store that stops answering."""

    def __init__(self, kv, hang: str | None = None):
        self.kv, self.hang, self.calls, self._promises = kv, hang, [], []

    def read(self, key, *args, **kwargs):
        key = key.decode() if isinstance(key, bytes) else key
        self.calls.append(("read", key))
        if self.hang is not None and key.startswith(self.hang):
            promise, future = ts.Promise.new()
            self._promises.append(promise)  # never resolved
            return future
        return self.kv.read(key, *args, **kwargs)

    def write(self, key, value, *args, **kwargs):
        self.calls.append(("write", key))
        return self.kv.write(key, value, *args, **kwargs)

    def list(self, key_range, *args, **kwargs):
        self.calls.append(("list", key_range.inclusive_min))
        return self.kv.list(key_range, *args, **kwargs)

    def delete_range(self, key_range):
        self.calls.append(("delete", key_range.inclusive_min))
        return self.kv.delete_range(key_range)

    def kinds(self):
        return collections.Counter(kind for kind, _ in self.calls)


def test_a_poll_reads_only_the_pointer_whatever_the_history(tmp_path):
    """With 5 or 100 versions in the store, a poll that finds nothing new is one read of LATEST
    and a poll that finds a new version adds only that version's manifest and blobs and the
    subscriber's lease: no LIST."""
    counts = {}
    for n in (5, 100):
        url = tmp_path / f"store{n}"
        params = [make_params()] + adam_like_steps(make_params(), n)
        pub, _ = publish_all(url, params[:n], full_every=8)
        sub = ws.WeightSubscriber(url)
        fetcher = ws.BackgroundFetcher(sub, lambda p, v: None)
        assert fetcher.poll_once() == n - 1
        sub.store.kv = kv = CountingKv(sub.store.kv)
        assert [fetcher.poll_once() for _ in range(3)] == [None] * 3
        assert kv.calls == [("read", ws.LATEST)] * 3
        kv.calls.clear()
        pub.publish(params[n], n)  # a delta
        assert fetcher.poll_once() == n and sub.last_applied == [n]
        blobs = [("read", f"blobs/{n:012d}/{name}") for name in ws.flatten(params[n])]
        lease = ("write", f"subscribers/{sub.id}.json")  # the lease moves to the new version
        assert sorted(kv.calls) == sorted(
            [("read", ws.LATEST), ("read", f"manifests/{n:012d}.json"), *blobs, lease]
        )
        counts[n] = len(kv.calls)
    assert counts[5] == counts[100]


def _write_pointer(root, version, manifest_checksum):
    pointer = {"format": 1, "version": version, "manifest_checksum": manifest_checksum}
    (root / "LATEST").write_text(json.dumps(pointer))


POINTERS = {
    "torn": lambda root: (root / "LATEST").write_text('{"format": 1, "vers'),
    "missing": lambda root: (root / "LATEST").unlink(),
    "names a pruned version": lambda root: _write_pointer(root, 9, ws.checksum(b"{}")),
    "wrong manifest checksum": lambda root: _write_pointer(root, 2, "0" * 32),
}


@pytest.mark.parametrize("case", sorted(POINTERS))
def test_a_torn_or_stale_pointer_is_not_trusted(tmp_path, versions, case):
    """A pointer that cannot be parsed, or names a manifest that is absent or does not match,
    is replaced by one LIST of the manifests (once for that pointer, not at every poll)."""
    publish_all(tmp_path, versions[:4], full_every=8)
    pointer = json.loads((tmp_path / "LATEST").read_text())
    manifest = (tmp_path / "manifests" / f"{3:012d}.json").read_bytes()
    assert pointer == {"format": 1, "version": 3, "manifest_checksum": ws.checksum(manifest)}
    POINTERS[case](tmp_path)
    sub = ws.WeightSubscriber(tmp_path)
    sub.store.kv = kv = CountingKv(sub.store.kv)
    assert sub.latest_version() == 3 and kv.kinds()["list"] == 1
    assert sub.latest_version() == 3 and kv.kinds()["list"] == 1  # the same pointer: no LIST
    version, params = sub.fetch()
    assert version == 3 and kv.kinds()["list"] == 1
    assert_holds(params, versions[3])
    ws.WeightPublisher(tmp_path).publish(versions[4], 4)  # a good pointer again
    assert sub.latest_version() == 4 and kv.kinds()["list"] == 1


def test_prune_keeps_leased_versions_and_an_expired_lease_stops_pinning(tmp_path, versions):
    """A subscriber that dies without close() pins its version only until its lease lapses;
    a live one (a longer lease, or renewed) keeps the chain from the version it holds."""
    pub, _ = publish_all(tmp_path, versions, full_every=3)  # anchors 0, 3, 6, 9
    dead = ws.WeightSubscriber(tmp_path, lease_s=10)
    live = ws.WeightSubscriber(tmp_path, lease_s=60)
    dead.fetch(4)
    live.fetch(7)
    lease = json.loads((tmp_path / "subscribers" / f"{dead.id}.json").read_text())
    assert lease["version"] == 4 and lease["expires"] == pytest.approx(lease["renewed"] + 10)
    assert pub.prune(keep=2) == [0, 1, 2]  # dead holds 4: the newest anchor it passed is 3
    later = time.time() + 30  # dead's lease has lapsed, live's has not
    assert pub.subscribers(now=later) == {live.id: 7}
    assert pub.prune(keep=2, now=later) == [3, 4, 5]  # live holds 7: anchor 6 stays
    assert pub.prune(keep=2, now=later) == []
    assert not list((tmp_path / "blobs").glob(f"{5:012d}/*"))
    _, params = live.fetch(8)  # from the version it holds
    assert live.last_applied == [8]
    assert_holds(params, versions[8])
    assert pub.prune(keep=1, now=time.time() + 120) == [6, 7, 8]  # every lease lapsed


def test_kvstore_urls(monkeypatch):
    assert ws.kvstore_spec("/a/b") == {"driver": "file", "path": "/a/b/"}
    assert ws.kvstore_spec("file:///a/b/") == {"driver": "file", "path": "/a/b/"}
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    assert ws.kvstore_spec("s3://weights/run/7") == {
        "driver": "s3",
        "bucket": "weights",
        "path": "run/7/",
        "endpoint": "http://127.0.0.1:9000",
        "aws_region": "eu-west-1",
    }
    assert ws.kvstore_spec("gs://weights/run") == {
        "driver": "gcs",
        "bucket": "weights",
        "path": "run/",
    }
    with pytest.raises(ValueError, match="expected a path, file://, s3:// or gs://"):
        ws.kvstore_spec("ftp://x/y")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_server(monkeypatch, tmp_path):
    """A real S3-protocol server (moto's) on the loopback, a bucket, and the AWS environment."""
    boto3 = pytest.importorskip("boto3")
    server_mod = pytest.importorskip("moto.server")
    for name, value in {
        "AWS_ACCESS_KEY_ID": "test-key",
        "AWS_SECRET_ACCESS_KEY": "test-secret",
        "AWS_REGION": "us-east-1",
        # No profile files on this machine: empty ones keep the AWS client quiet.
        "AWS_CONFIG_FILE": str(tmp_path / "aws_config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws_credentials"),
    }.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "aws_config").write_text("")
    (tmp_path / "aws_credentials").write_text("")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
        Bucket="weights"
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    yield boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    server.stop()


def test_s3_end_to_end(s3_server, versions):
    url = "s3://weights/runs/rl"
    pub, reports = publish_all(url, versions[:5], full_every=2)
    assert [r.base_version for r in reports] == [None, 0, None, 2, None]
    listed = s3_server.list_objects_v2(Bucket="weights", Prefix="runs/rl/manifests/")
    assert len(listed["Contents"]) == 5
    sub = ws.WeightSubscriber(url)
    sub.fetch(1)
    version, params = sub.fetch(3)
    assert version == 3 and sub.last_applied == [2, 3]
    assert_holds(params, versions[3])
    assert pub.prune(keep=1) == [0, 1]
    s3_server.delete_object(Bucket="weights", Key=f"runs/rl/blobs/{4:012d}/embed")
    with pytest.raises(ws.WeightSyncError, match="version 4, tensor 'embed': blob missing"):
        sub.fetch()
    assert sub.version == 3


def test_the_fetcher_keeps_errors_and_recovers_at_the_next_good_version(tmp_path, versions):
    publish_all(tmp_path, versions[:3], full_every=8)
    sub = ws.WeightSubscriber(tmp_path)
    sub.fetch(0)
    _corrupt_blob(tmp_path, 2, "embed")
    delivered = []
    with ws.BackgroundFetcher(sub, lambda p, v: delivered.append(v), poll_s=0.01).start() as f:
        while not f.errors:
            time.sleep(0.01)
        assert delivered == [] and sub.version == 0  # version 2 is bad: nothing half-applied
        ws.WeightPublisher(tmp_path).publish(versions[3], 3)  # a new anchor
        assert f.wait_for(3, timeout=60)
    assert delivered == [3] and sub.last_applied == [3]
    assert "version 2, tensor 'embed': checksum mismatch" in str(f.errors[0])


def test_a_fetch_that_keeps_failing_is_fatal_and_names_the_version(tmp_path, versions):
    """Retried with a growing wait; after max_failures in a row the fetcher stops and hands
    on_fatal an error naming the version, the cause and the version still held."""
    publish_all(tmp_path, versions[:3], full_every=8)
    sub = ws.WeightSubscriber(tmp_path)
    sub.fetch(0)
    _corrupt_blob(tmp_path, 2, "embed")
    fatal = []
    f = ws.BackgroundFetcher(sub, lambda p, v: None, poll_s=0.001, max_failures=4,
                             on_fatal=fatal.append).start()  # fmt: skip
    assert not f.wait_for(2)  # returns (False) once the fetcher gave up: no timeout needed
    f.stop()
    (error,) = fatal
    assert error is f.fatal and len(f.errors) == 4 and error.version == 2
    assert error.tensor == "embed"
    assert "fetching version 2 of" in str(error) and "failed 4 times in a row" in str(error)
    assert "holding version 0" in str(error) and "checksum mismatch" in str(error)
    assert sub.version == 0


FETCH_FAILURES = {
    "deleted shard": (
        lambda root: (root / "blobs" / f"{2:012d}" / "embed").unlink(),
        "blob missing",
    ),
    "corrupt shard": (lambda root: _corrupt_blob(root, 2, "embed"), "checksum mismatch"),
    "store stops answering": (None, "reading blobs/000000000002/.* no answer in 0.05 s"),
}


@pytest.mark.parametrize("case", sorted(FETCH_FAILURES))
def test_a_failing_fetch_is_retried_then_an_error_naming_the_version(tmp_path, versions, case):
    """Every store request has a deadline, so a store that never answers fails like a damaged
    one: retried, then handed to on_fatal as an error naming the version, never a hang."""
    damage, message = FETCH_FAILURES[case]
    publish_all(tmp_path, versions[:3], full_every=8)
    sub = ws.WeightSubscriber(tmp_path, timeout_s=0.05)
    sub.fetch(0)
    if damage is None:
        sub.store.kv = CountingKv(sub.store.kv, hang=f"blobs/{2:012d}/")
    else:
        damage(tmp_path)
    fatal = []
    f = ws.BackgroundFetcher(sub, lambda p, v: None, poll_s=0.001, max_failures=3,
                             on_fatal=fatal.append).start()  # fmt: skip
    assert not f.wait_for(2, timeout=120)  # False once the fetcher gave up
    f.stop()
    (error,) = fatal
    assert error.version == 2 and len(f.errors) == 3 and sub.version == 0
    assert "fetching version 2 of" in str(error) and "failed 3 times in a row" in str(error)
    assert re.search(message, str(error))


def _ready_later(tree):
    """`tree` again, as arrays that exist only after a second or so of device work (dispatch
    returns at once): weights handed to the engine while still being computed."""

    @jax.jit
    def through(t):
        m = jnp.full((512, 512), 1 / 512, jnp.float32)
        z = jax.lax.fori_loop(0, 200, lambda i, c: jnp.tanh(c @ m), jnp.ones((512, 512)))
        zero = z[0, 0] * 0  # every leaf waits for the loop; its value is unchanged
        return jax.tree.map(lambda x: x + zero.astype(x.dtype), t)

    return through(tree)


def test_a_following_engine_swaps_in_each_new_version(tmp_path):
    """A worker loads version 0 from the store, builds its engine on those exact bits, and
    follows: fetch and decode run on the fetcher's thread, the engine only swaps at a step. The
    pause it reports lasts until the new arrays exist: handed weights still being computed, a
    step that does nothing else is all pause, and its arrays are ready when it returns."""
    cfg = model.presets.get("tiny_kimi_k2", vocab_size=64, max_seq_len=64, dtype="float32")
    rng = np.random.default_rng(0)  # any weights will do (no init to compile)
    normal = lambda s: jnp.asarray(0.02 * rng.standard_normal(s.shape), s.dtype)
    masters = [jax.tree.map(normal, model.abstract_params(cfg))]
    masters += adam_like_steps(masters[0], 2, lr=1e-4)
    pub = ws.WeightPublisher(tmp_path, full_every=8)
    pub.publish(masters[0], 0)
    sub = ws.WeightSubscriber(tmp_path, like=masters[0])
    version, params = sub.fetch()
    engine = Engine(params, cfg, max_slots=2, max_len=32, prefill_chunk=16, version=version)
    jax.block_until_ready(_ready_later(params))  # compiled before it is timed

    def update(params, version):  # the engine gets arrays that are not ready yet
        engine.update_weights(_ready_later(params), version)

    with ws.BackgroundFetcher(sub, update, poll_s=0.01).start() as fetcher:
        for v in (1, 2):
            pub.publish(masters[v], v)
            assert fetcher.wait_for(v, timeout=60), fetcher.errors
            pause0 = engine.stats.get("update_pause_s", 0.0)
            engine.step()  # nothing to decode: the step only applies the pending update
            # the pause timed the swap, not its dispatch: the arrays exist when the step returns
            assert all(x.is_ready() for x in jax.tree.leaves(engine._params))
            assert engine.stats["update_pause_s"] > pause0
            assert engine.version == v
            assert_holds(engine.params, masters[v])
    assert not fetcher.errors
    assert engine.stats["weight_updates"] == len(fetcher.delivered) and fetcher.delivered[-1] == 2
