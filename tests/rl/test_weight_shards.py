"""The weight store shard by shard: a trainer's sharded arrays are published a blob per distinct
shard (each written once, replicas skipped), deltas per shard, the manifest only once every shard
is written; a subscriber on another mesh reads only the shards its devices' slices overlap and
gets bit-exact arrays in its own layout. Two trainer processes x 4 devices publish FSDP shards,
and engines on other meshes (one spanning both processes, one of 4 devices in a third process)
fetch them: the bytes each reads are exactly its devices' slices."""

import json
import math
import os
import socket
import subprocess
import sys
import zlib
from pathlib import Path

import chex
import jax
import ml_dtypes
import numpy as np
import pytest

from c2 import distributed, model, sharding
from c2.model import params as model_params
from c2.rl import weight_shards as shards
from c2.rl import weight_sync as ws

ROOT = Path(__file__).parents[2]

# The tiny model of tests/test_multihost.py: every rule's axis divides on fsdp 4 x expert 2 and
# on expert 4 x tensor 2.
MODEL = dict(
    vocab_size=64, max_seq_len=64, dtype="float32", d_model=32, n_layers=2, n_heads=2, d_ff=64,
    d_ff_expert=16, n_experts=4, n_experts_per_token=2, q_lora_rank=16, kv_lora_rank=16,
    qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, mtp_depth=0,
)  # fmt: skip


def tiny_cfg():
    return model.presets.get("tiny_kimi_k2", **MODEL)


def masters(cfg, version: int) -> dict[str, np.ndarray]:
    """{name: float32 master} of a version (Adam-like steps from version 0): the same bits in
    every process."""
    out = {}
    for name, s in ws.flatten(model.abstract_params(cfg)).items():
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        x = 0.02 * rng.standard_normal(s.shape)
        out[name] = (x + 1e-4 * version * np.sign(rng.standard_normal(s.shape))).astype(s.dtype)
    return out


def served(name: str, x: np.ndarray) -> np.ndarray:
    """The serving-dtype cast of a master: bf16, but the router in float32."""
    if x.dtype == np.float32 and name.rsplit("/", 1)[-1] not in ws.KEEP_DTYPE:
        return x.astype(ml_dtypes.bfloat16)
    return x


def laid_out(host: dict[str, np.ndarray], shardings: dict) -> dict:
    """Global arrays of the host masters under a tree of shardings (each device its slice)."""
    flat = shards.flat_shardings(shardings, host)
    return ws.unflatten(
        {
            n: jax.make_array_from_callback(x.shape, flat[n], lambda i, x=x: x[i])
            for n, x in host.items()
        }
    )


def slice_bytes(cfg, shardings) -> int:
    """The bytes of the distinct slices this process's devices hold under `shardings`, each
    replicated slice once, in the serving dtypes: what a subscriber on them must read."""
    flat = shards.flat_shardings(shardings, ws.flatten(model.abstract_params(cfg)))
    total = 0
    for name, x in masters(cfg, 0).items():
        itemsize = served(name, x).itemsize
        regions = {
            shards.as_index(i, x.shape)
            for i in flat[name].addressable_devices_indices_map(x.shape).values()
        }
        total += sum(math.prod(shards.index_shape(r)) * itemsize for r in regions)
    return total


def mismatches(cfg, params, version: int) -> list[str]:
    """Tensors whose addressable shards differ from the served bits of the masters."""
    want = masters(cfg, version)
    bad = []
    for name, x in ws.flatten(params).items():
        ref = served(name, want[name])
        for s in x.addressable_shards:
            got = np.asarray(s.data)
            if got.dtype != ref.dtype or not np.array_equal(
                got.view(np.uint8), ref[s.index].view(np.uint8)
            ):
                bad.append(name)
    return sorted(set(bad))


# One process: 8 devices ------------------------------------------------------------------------


def fsdp_shardings(cfg, devices=None):
    mesh = sharding.make_mesh(fsdp=4, expert=2, devices=devices)
    return model_params.param_shardings(cfg, mesh)


def engine_shardings(cfg, devices):
    mesh = sharding.make_mesh(expert=2, tensor=2, devices=devices)
    return model_params.param_shardings(cfg, mesh)


def test_shards_written_once_deltas_per_shard_and_fetched_on_another_mesh(tmp_path):
    cfg = tiny_cfg()
    train = fsdp_shardings(cfg)
    pub = ws.WeightPublisher(tmp_path, full_every=8)
    reports = [pub.publish(laid_out(masters(cfg, v), train), v) for v in range(3)]
    assert [r.base_version for r in reports] == [None, 0, 1]
    m = json.loads((tmp_path / "manifests" / f"{1:012d}.json").read_text())
    flat = shards.flat_shardings(train, masters(cfg, 0))
    blobs = tmp_path / "blobs" / f"{1:012d}"
    written = sorted(p.relative_to(blobs).as_posix() for p in blobs.rglob("*") if p.is_file())
    keys = []
    for t in m["tensors"]:
        shape = tuple(t["shape"])
        grid = sorted(
            {shards.as_index(i, shape) for i in flat[t["name"]].devices_indices_map(shape).values()}
        )
        listed = [s["index"] for s in shards.shards_of(t)]
        assert listed == list(grid), t["name"]  # every distinct shard, each once
        assert ("shards" in t) == (len(grid) > 1)
        keys += [shards.key(t["name"], i, tuple(t["shape"])) for i in listed]
    assert written == sorted(keys)  # a blob per shard; replicas (over expert) not written
    embed = {t["name"]: t for t in m["tensors"]}["embed"]
    # fsdp splits its d_model columns; the expert axis replicates them (written once)
    columns = [x["index"][1] for x in embed["shards"]]
    assert columns == [[0, 8], [8, 16], [16, 24], [24, 32]]
    assert all(x["index"][0] == [0, 64] for x in embed["shards"])
    # One subscriber whole, one on an expert 2 x tensor 2 mesh of other devices: both exact.
    whole = ws.WeightSubscriber(tmp_path, register=False)
    engine = engine_shardings(cfg, jax.devices()[4:])
    sub = ws.WeightSubscriber(tmp_path, register=False, shardings=engine)
    for v in range(3):
        _, params = whole.fetch(v)
        for name, x in ws.flatten(params).items():
            chex.assert_trees_all_equal(np.asarray(x), served(name, masters(cfg, v)[name]))
        _, params = sub.fetch(v)
        assert sub.last_applied == [v] and mismatches(cfg, params, v) == []
        for name, s in shards.flat_shardings(engine, masters(cfg, 0)).items():
            assert ws.flatten(params)[name].sharding == s
        # one process holds every device of its mesh: it reads each byte of the model once
        assert sub.last_read["raw_bytes_read"] == slice_bytes(cfg, engine) == reports[v].full_bytes
        assert sub.last_read["bytes_read"] == reports[v].stored_bytes
    assert reports[1].stored_bytes < reports[0].stored_bytes / 2  # deltas, shard by shard


def test_a_missing_shard_names_version_tensor_and_shard_and_keeps_the_held(tmp_path):
    cfg = tiny_cfg()
    train = fsdp_shardings(cfg)
    pub = ws.WeightPublisher(tmp_path, full_every=8)
    for v in range(2):
        pub.publish(laid_out(masters(cfg, v), train), v)
    sub = ws.WeightSubscriber(tmp_path, register=False)
    sub.fetch(0)
    (tmp_path / "blobs" / f"{1:012d}" / "embed" / "0.8").unlink()
    with pytest.raises(
        ws.WeightSyncError, match=r"version 1, tensor 'embed' shard \[0:64, 8:16\]: blob missing"
    ) as err:
        sub.fetch(1)
    assert (err.value.version, err.value.tensor) == (1, "embed") and sub.version == 0
    _, params = sub.fetch(0)
    chex.assert_trees_all_equal(
        np.asarray(params["embed"]), served("embed", masters(cfg, 0)["embed"])
    )


def test_the_manifest_is_written_only_after_every_shard(tmp_path, monkeypatch):
    """Writes come in the order shards, manifest, LATEST; a version with a shard that failed to
    write, or one no process wrote, gets no manifest and stays invisible."""
    cfg = tiny_cfg()
    train = fsdp_shardings(cfg)
    pub = ws.WeightPublisher(tmp_path, full_every=8)
    order = []
    write = ws._Store.write
    monkeypatch.setattr(ws._Store, "write", lambda self, k, v: (order.append(k), write(self, k, v)))
    pub.publish(laid_out(masters(cfg, 0), train), 0)
    m = json.loads((tmp_path / "manifests" / f"{0:012d}.json").read_text())
    n_shards = sum(len(shards.shards_of(t)) for t in m["tensors"])
    assert len(order) == n_shards + 2 and all(k.startswith("blobs/") for k in order[:-2])
    assert order[-2:] == [f"manifests/{0:012d}.json", "LATEST"]

    def fail_one(self, key, value):
        if key == f"blobs/{1:012d}/embed/0.16":
            raise OSError("disk full")
        return write(self, key, value)

    monkeypatch.setattr(ws._Store, "write", fail_one)
    with pytest.raises(OSError, match="disk full"):
        pub.publish(laid_out(masters(cfg, 1), train), 1)
    monkeypatch.setattr(ws._Store, "write", write)
    local = shards.local_shards  # a process that wrote nothing of `embed` (a dropped shard)
    monkeypatch.setattr(
        shards, "local_shards", lambda x: local(x)[: 3 if x.shape == (64, 32) else None]
    )
    with pytest.raises(
        ws.WeightSyncError,
        match=r"version 2, tensor 'embed': not published: its shards cover 1536 of its 2048",
    ):
        pub.publish(laid_out(masters(cfg, 2), train), 2)
    assert not (tmp_path / "manifests" / f"{1:012d}.json").exists()
    assert not (tmp_path / "manifests" / f"{2:012d}.json").exists()
    assert ws.WeightSubscriber(tmp_path, register=False).latest_version() == 0


def test_a_new_trainer_layout_is_an_anchor_and_a_new_engine_layout_reads_from_one(tmp_path):
    cfg = tiny_cfg()
    pub = ws.WeightPublisher(tmp_path, full_every=8)
    pub.publish(laid_out(masters(cfg, 0), fsdp_shardings(cfg)), 0)
    pub.publish(laid_out(masters(cfg, 1), fsdp_shardings(cfg)), 1)
    other = model_params.param_shardings(cfg, sharding.make_mesh(fsdp=8))
    assert pub.publish(laid_out(masters(cfg, 2), other), 2).base_version is None
    assert pub.publish(laid_out(masters(cfg, 3), other), 3).base_version == 2
    sub = ws.WeightSubscriber(tmp_path, register=False)
    sub.fetch(2)
    engine = engine_shardings(cfg, jax.devices()[:4])
    _, params = sub.fetch(3, shardings=engine)  # other slices than those held: from the anchor
    assert sub.last_applied == [2, 3] and mismatches(cfg, params, 3) == []
    _, params = sub.fetch(3, shardings=engine)  # the same: nothing read
    assert sub.last_read["bytes_read"] == 0 and mismatches(cfg, params, 3) == []


# Two trainer processes x 4 devices -----------------------------------------------------------

WORKER = """
import json, sys
from c2 import distributed
address, process = sys.argv[1], int(sys.argv[2])
distributed.initialize(coordinator_address=address, num_processes=2, process_id=process)
import jax
sys.path.insert(0, {tests!r})
import test_weight_shards as t
from c2 import sharding
from c2.model import params as model_params
from c2.rl import weight_sync as ws

cfg, url, out = t.tiny_cfg(), sys.argv[3], {{}}
train = t.fsdp_shardings(cfg)  # fsdp 4 x expert 2 over both processes' 8 devices
pub = ws.WeightPublisher(url, full_every=8)
for v in range(2):
    out[f"published_{{v}}"] = pub.publish(t.laid_out(t.masters(cfg, v), train), v).stored_bytes
out["blob_writes"] = pub.store.requests["write"] - (4 if jax.process_index() == 0 else 0)
# An engine over both processes (expert 4 x tensor 2): each process reads its own experts.
engine = model_params.param_shardings(cfg, sharding.make_mesh(expert=4, tensor=2))
sub = ws.WeightSubscriber(url, register=False, shardings=engine)
out["needed_bytes"] = t.slice_bytes(cfg, engine)
for v in range(2):
    _, params = sub.fetch(v)
    out[f"raw_{{v}}"] = sub.last_read["raw_bytes_read"]
    out[f"mismatches_{{v}}"] = t.mismatches(cfg, params, v)
distributed.barrier("fetched")
open(sys.argv[4] + f"/{{jax.process_index()}}.json", "w").write(json.dumps(out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def test_two_trainer_processes_publish_their_shards_and_engines_read_only_theirs(tmp_path):
    """Each of 2 processes (4 devices each) writes only its replica-0 FSDP shards; the version is
    complete once both have; an engine spanning both processes reads on each only the slices
    its devices hold (about half the experts), and one of 4 devices here reads every byte
    once; all bit-exact to the bf16 cast of the masters."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    from _support import xla_flags  # not at the top: the workers import this module

    env["XLA_FLAGS"] = xla_flags(4)
    for name in distributed.ENV.values():
        env.pop(name, None)
    store, address = tmp_path / "store", f"localhost:{_free_port()}"
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    procs = [
        subprocess.Popen([sys.executable, str(script), address, str(i), str(store), str(tmp_path)],
                         cwd=ROOT, env=env, stdout=logs[i].open("w"), stderr=subprocess.STDOUT)
        for i in range(2)
    ]  # fmt: skip
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert codes == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    out = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    cfg = tiny_cfg()
    m = [json.loads((store / "manifests" / f"{v:012d}.json").read_text()) for v in range(2)]
    n_shards = sum(len(shards.shards_of(t)) for t in m[1]["tensors"])
    # each distinct shard written exactly once across the processes, both writing
    assert (
        sum(o["blob_writes"] for o in out) == 2 * n_shards
        and min(o["blob_writes"] for o in out) > 0
    )
    full = sum(t["bytes"] for t in m[0]["tensors"])
    for o in out:
        assert o["mismatches_0"] == o["mismatches_1"] == []
        assert o["raw_0"] == o["raw_1"] == o["needed_bytes"] < full  # only its own slices
    # A 4-device engine in this process (expert 2 x tensor 2): every byte once, exact.
    engine = engine_shardings(cfg, jax.devices()[:4])
    sub = ws.WeightSubscriber(store, register=False, shardings=engine)
    for v in range(2):
        _, params = sub.fetch(v)
        assert mismatches(cfg, params, v) == []
        assert sub.last_read["raw_bytes_read"] == slice_bytes(cfg, engine) == full
        assert sub.last_read["bytes_read"] == sum(t["stored_bytes"] for t in m[v]["tensors"])


def test_the_trainer_hands_the_engine_a_copy_in_its_layout():
    """One process: `engine_weights.for_engine` reshards the trainer's FSDP arrays to the
    engine's layout as a copy (the update donates the trainer's buffers); no layout: one device,
    as before."""
    from c2.rl import engine_weights

    cfg = tiny_cfg()
    params = laid_out(masters(cfg, 0), fsdp_shardings(cfg))
    engine = engine_shardings(cfg, jax.devices()[:4])
    for target in (engine, None):
        got = ws.flatten(engine_weights.for_engine(params, target))
        one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        want = shards.flat_shardings(engine if target else one, got)
        for name, x in ws.flatten(params).items():
            y = got[name]
            assert y.sharding.is_equivalent_to(want[name], x.ndim) and y.dtype == x.dtype
            np.testing.assert_array_equal(np.asarray(y), masters(cfg, 0)[name])
            ours = {s.data.unsafe_buffer_pointer() for s in x.addressable_shards}
            assert ours.isdisjoint(s.data.unsafe_buffer_pointer() for s in y.addressable_shards)
