"""orbax checkpoints of a training run, with a checksum so a damaged latest one is detected.

With several processes (hosts), every one calls `save` and `restore_latest` (orbax writes and
reads collectively, each host its own shards, into one directory every host sees); `meta` is
written by process 0, `data` once per process.

One checkpoint per saved step holds three items: `params` and `opt_state` (sharded arrays,
written asynchronously and atomically by orbax) and `meta` (JSON: step, RNG key data, the data
iterator's state, compute counters, and a checksum of every array). Restoring tries the newest
step first; if it fails to read or its checksums disagree, it warns, moves it aside and uses the
previous one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from c2.train.optimizer import path_str

log = logging.getLogger(__name__)

_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


def _leaf_checksum(x: jax.Array) -> jax.Array:
    """A position-aware uint32 checksum of the array's bits (wrapping sums: sharding-invariant)."""
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    else:
        bits = jax.lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize]).astype(jnp.uint32)
    weight = jnp.ones(x.shape, jnp.uint32)
    for axis, prime in zip(
        range(x.ndim), (2654435761, 2246822519, 3266489917, 668265263, 374761393)
    ):
        iota = jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis)
        weight = weight + iota * jnp.uint32(prime)
    return jnp.sum(bits * weight, dtype=jnp.uint32)


@jax.jit
def _checksums(leaves):
    return [_leaf_checksum(x) for x in leaves]


def tree_checksums(tree) -> dict[str, int]:
    """{path: checksum} for every array leaf of `tree`; one jit per set of devices the leaves
    live on (a run's state is all on its mesh: one compiled computation)."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    groups: dict = {}
    for i, (_, x) in enumerate(flat):
        groups.setdefault(frozenset(x.sharding.device_set), []).append(i)
    sums = [None] * len(flat)
    for idx in groups.values():
        for i, v in zip(idx, jax.device_get(_checksums([flat[i][1] for i in idx]))):
            sums[i] = int(np.asarray(v))
    return {path_str(p): v for (p, _), v in zip(flat, sums)}


def _split(sums: dict[str, int]) -> dict[str, dict[str, int]]:
    """{"params/a/b": s} -> {"params": {"a/b": s}} (one checksum pass covers both trees)."""
    out: dict[str, dict[str, int]] = {}
    for path, value in sums.items():
        top, _, rest = path.partition("/")
        out.setdefault(top, {})[rest] = value
    return out


class ProcessStateHandler(ocp.CheckpointHandler):
    """One JSON file per process: each host's data-iterator state (captured when the save is
    requested, so the background write never races the iterator)."""

    @staticmethod
    def _file(directory) -> str:
        return f"process_{jax.process_index()}-of-{jax.process_count()}.json"

    def save(self, directory, args: ProcessStateSave):
        (directory / self._file(directory)).write_text(json.dumps(args.state))

    def restore(self, directory, args: ProcessStateRestore | None = None):
        path = directory / self._file(directory)
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing (was the run saved with another host count?)"
            )
        return json.loads(path.read_text())

    def metadata(self, directory):
        return None

    def finalize(self, directory):
        pass

    def close(self):
        pass


@ocp.args.register_with_handler(ProcessStateHandler, for_save=True)
@dataclasses.dataclass
class ProcessStateSave(ocp.args.CheckpointArgs):
    state: object


@ocp.args.register_with_handler(ProcessStateHandler, for_restore=True)
@dataclasses.dataclass
class ProcessStateRestore(ocp.args.CheckpointArgs):
    pass


class CorruptCheckpoint(RuntimeError):
    """A checkpoint that cannot be read back as it was written."""


class Checkpointer:
    """Saves and restores a run's state under DIR/checkpoints (keep the newest `keep`)."""

    def __init__(self, directory: str | Path, *, keep: int = 3, async_save: bool = True):
        self.directory = Path(directory).absolute()
        self._options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=async_save,
            create=True,
            cleanup_tmp_directories=True,
        )
        self._open()

    def _open(self) -> None:
        self._mngr = ocp.CheckpointManager(
            self.directory,
            options=self._options,
            item_names=("params", "opt_state", "meta", "data"),
        )

    def all_steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def save(
        self, step: int, params, opt_state, meta: Mapping, data_state=None, *, force: bool = False
    ) -> bool:
        """Starts an async save of the state after `step` steps; `meta` (written by the primary
        host) and `data_state` (this host's iterator state, one file per host) are JSON-able."""
        meta = dict(meta) | {
            "step": int(step),
            "checksums": _split(tree_checksums({"params": params, "opt_state": opt_state})),
        }
        return self._mngr.save(
            step,
            args=ocp.args.Composite(
                params=ocp.args.StandardSave(params),
                opt_state=ocp.args.StandardSave(opt_state),
                meta=ocp.args.JsonSave(meta),
                data=ProcessStateSave(data_state),
            ),
            force=force,
        )

    def _restore_step(self, step: int, abstract_params, abstract_opt_state):
        items = {"meta": ocp.args.JsonRestore(), "data": ProcessStateRestore()}
        if abstract_params is not None:
            items["params"] = ocp.args.StandardRestore(abstract_params)
        if abstract_opt_state is not None:
            items["opt_state"] = ocp.args.StandardRestore(abstract_opt_state)
        try:
            out = self._mngr.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # orbax/tensorstore raise many types for unreadable files
            raise CorruptCheckpoint(f"step {step}: cannot be read ({type(e).__name__}: {e})") from e
        meta = out["meta"]
        if not isinstance(meta, Mapping) or meta.get("step") != step:
            raise CorruptCheckpoint(f"step {step}: metadata missing or for another step")
        restored = {name: out[name] for name in ("params", "opt_state") if name in items}
        for name, sums in _split(tree_checksums(restored)).items():
            if sums != meta["checksums"][name]:
                raise CorruptCheckpoint(f"step {step}: {name} do not match their checksums")
        return out

    def _set_aside(self, step: int) -> None:
        """Moves a damaged step out of orbax's way, keeping it for inspection."""
        src = self.directory / str(step)
        dst = self.directory.parent / "corrupt_checkpoints" / f"{step}-{int(time.time())}"
        if jax.process_index() == 0:  # several hosts share the directory: the first one moves
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.exists():
                shutil.move(str(src), str(dst))
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"c2 checkpoint {step} set aside")
        self._mngr.close()
        self._open()

    def restore_latest(self, abstract_params, abstract_opt_state=None, *, set_aside=True):
        """(step, params, opt_state, meta) of the newest good checkpoint, or None if none is;
        meta["data_state"] is this host's data-iterator state.

        `abstract_*` are pytrees of jax.ShapeDtypeStruct with shardings; pass None for
        `abstract_opt_state` to read the parameters only (a new stage starting from this one).
        """
        for step in reversed(self.all_steps()):
            try:
                out = self._restore_step(step, abstract_params, abstract_opt_state)
            except CorruptCheckpoint as e:
                log.warning("checkpoint %s is damaged (%s); falling back to an older one", step, e)
                if set_aside:
                    self._set_aside(step)
                continue
            return (
                step,
                out.get("params"),
                out.get("opt_state"),
                out["meta"] | {"data_state": out["data"]},
            )
        return None

    def restore_step(self, step: int, abstract_params):
        """The parameters saved after `step` steps; CorruptCheckpoint when they cannot be read
        (a missing step included: the steps there are named)."""
        if step not in self.all_steps():
            raise CorruptCheckpoint(
                f"step {step}: no such checkpoint in {self.directory} (steps: {self.all_steps()})"
            )
        return self._restore_step(step, abstract_params, None)["params"]

    def wait(self) -> None:
        self._mngr.wait_until_finished()

    def close(self) -> None:
        self._mngr.wait_until_finished()
        self._mngr.close()
