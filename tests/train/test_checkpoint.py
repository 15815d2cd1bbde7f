"""Checkpoints restore exactly; a damaged or half-written latest one falls back with a warning."""

import logging
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from c2.train.checkpoint import Checkpointer, tree_checksums


@pytest.fixture
def mesh():
    return jax.make_mesh((4, 2), ("data", "fsdp"))


def _state(mesh, scale):
    shard = NamedSharding(mesh, P("fsdp", None))
    params = {
        "w": jax.device_put(jnp.arange(24.0).reshape(8, 3) * scale, shard),
        "b": jnp.full((3,), scale, jnp.bfloat16),
    }
    opt_state = {"mu": jax.tree.map(lambda x: x * 0.5, params), "count": jnp.int32(7)}
    return params, opt_state


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _save_steps(ckpt, mesh, steps):
    for s in steps:
        params, opt_state = _state(mesh, float(s))
        ckpt.save(s, params, opt_state, {"rng": [s, 0]}, {"next_index": s})
    ckpt.wait()


def test_roundtrip_is_exact_with_shardings(tmp_path, mesh):
    ckpt = Checkpointer(tmp_path / "checkpoints", keep=2)
    _save_steps(ckpt, mesh, [1, 2, 3])
    assert ckpt.all_steps() == [2, 3]  # keep=2
    params, opt_state = _state(mesh, 3.0)
    step, p, o, meta = ckpt.restore_latest(_abstract(params), _abstract(opt_state))
    assert step == 3 and meta["data_state"] == {"next_index": 3} and meta["rng"] == [3, 0]
    chex.assert_trees_all_equal(p, params)
    chex.assert_trees_all_equal(o, opt_state)
    assert p["w"].sharding == params["w"].sharding
    ckpt.close()


def test_checksums_see_bit_flips_and_moves():
    x = jnp.arange(12.0).reshape(3, 4)
    base = tree_checksums({"x": x})["x"]
    flipped = x.at[1, 2].set(jnp.nextafter(x[1, 2], jnp.float32(99.0)))
    swapped = x.at[0, 1].set(x[0, 2]).at[0, 2].set(x[0, 1])
    assert tree_checksums({"x": flipped})["x"] != base
    assert tree_checksums({"x": swapped})["x"] != base
    assert tree_checksums({"x": x + 0.0})["x"] == base


def _corrupt_data_files(step_dir: Path):
    files = [f for f in (step_dir / "params").rglob("*") if f.is_file() and "/d/" in str(f)]
    assert files, "expected array data files"
    for f in files:
        raw = bytearray(f.read_bytes())
        for i in range(len(raw) // 2, len(raw)):
            raw[i] ^= 0x5A
        f.write_bytes(bytes(raw))


def _truncate_everything(step_dir: Path):
    for f in step_dir.rglob("*"):
        if f.is_file():
            f.write_bytes(b"")


def _drop_meta(step_dir: Path):
    for f in (step_dir / "meta").rglob("*"):
        if f.is_file():
            f.unlink()


def _drop_data_state(step_dir: Path):
    for f in (step_dir / "data").glob("process_*.json"):
        f.unlink()


@pytest.mark.parametrize(
    "damage", [_corrupt_data_files, _truncate_everything, _drop_meta, _drop_data_state]
)
def test_damaged_latest_falls_back_to_previous(tmp_path, mesh, caplog, damage):
    ckpt = Checkpointer(tmp_path / "checkpoints", keep=3)
    _save_steps(ckpt, mesh, [1, 2])
    ckpt.close()
    damage(tmp_path / "checkpoints" / "2")

    ckpt = Checkpointer(tmp_path / "checkpoints", keep=3)
    params, opt_state = _state(mesh, 1.0)
    with caplog.at_level(logging.WARNING):
        step, p, o, meta = ckpt.restore_latest(_abstract(params), _abstract(opt_state))
    assert step == 1 and meta["data_state"] == {"next_index": 1}
    chex.assert_trees_all_equal(p, params)
    chex.assert_trees_all_equal(o, opt_state)
    assert any("checkpoint 2 is damaged" in r.getMessage() for r in caplog.records)
    # the damaged step was moved aside, so the run can save step 2 again
    assert ckpt.all_steps() == [1]
    assert list((tmp_path / "corrupt_checkpoints").iterdir())
    _save_steps(ckpt, mesh, [2])
    assert ckpt.all_steps() == [1, 2]
    ckpt.close()


def test_half_written_tmp_directory_is_ignored(tmp_path, mesh):
    ckpt = Checkpointer(tmp_path / "checkpoints", keep=3)
    _save_steps(ckpt, mesh, [1])
    ckpt.close()
    # what a kill in the middle of an async save leaves: orbax's temporary directory
    tmp = tmp_path / "checkpoints" / "2.orbax-checkpoint-tmp-1234"
    (tmp / "params").mkdir(parents=True)
    (tmp / "params" / "partial").write_bytes(b"\x00" * 10)
    ckpt = Checkpointer(tmp_path / "checkpoints", keep=3)
    params, opt_state = _state(mesh, 1.0)
    assert ckpt.all_steps() == [1]
    assert ckpt.restore_latest(_abstract(params), _abstract(opt_state))[0] == 1
    ckpt.close()


def test_params_only_restore_and_empty_dir(tmp_path, mesh):
    ckpt = Checkpointer(tmp_path / "checkpoints", keep=2)
    params, opt_state = _state(mesh, 1.0)
    assert ckpt.restore_latest(_abstract(params), _abstract(opt_state)) is None
    _save_steps(ckpt, mesh, [5])
    step, p, o, _ = ckpt.restore_latest(_abstract(params), None)
    assert step == 5 and o is None
    np.testing.assert_array_equal(p["w"], _state(mesh, 5.0)[0]["w"])
    ckpt.close()
