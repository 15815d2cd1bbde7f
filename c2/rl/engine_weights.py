"""The trainer's weights on their way to the rollout engines (c2/rl/trainer.py): the engine's
mesh and layout (`config.rl.rollout_mesh`), the weight store a run uses, and the engine's copy.
No step gathers the whole model: in one process the engine gets a copy in its own layout; with
several trainer processes each publishes the shards it holds through the store.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp

from c2 import sharding
from c2.infer.engine_layout import weight_shardings
from c2.rl import orchestrator
from c2.train.config import sharding_rules


def store_url(config, workdir: Path) -> str:
    """The weight store's URL ("": weights go to the engine in process). Ray workers, and an
    engine fed by several trainer processes, read it: it defaults to DIR/weight_store (with
    several processes DIR must then be on a filesystem they share)."""
    r = config.rl
    needs = r.rollout_backend == "ray" or jax.process_count() > 1
    return r.weight_store or (str(workdir / "weight_store") if needs else "")


def store_weights(config, url: str, start: int, **kwargs) -> orchestrator.StoreWeights:
    """The run's weight store (`config.rl.weight_store_*`) from version `start`."""
    r = config.rl
    return orchestrator.StoreWeights(
        url,
        dtype=r.weight_store_dtype,
        full_every=r.weight_store_full_every,
        start=start,
        prune_every=r.weight_store_prune_every,
        keep=r.weight_store_keep,
        **kwargs,
    )


def engine_mesh(config) -> sharding.Layout | None:
    """The rollout engine's mesh (`config.rl.rollout_mesh`, on this process's first devices)
    under the stage's rules, or None: one device."""
    spec = config.rl.rollout_mesh
    return sharding.Layout(sharding.mesh_from_spec(spec), sharding_rules(config)) if spec else None


def engine_shardings(cfg, layout: sharding.Layout | None):
    """The weight layout of an engine on `layout` (`engine_mesh`), or None: one device."""
    return None if layout is None else weight_shardings(cfg, layout)


def for_engine(params, shardings=None):
    """The weights to hand the rollout engine. One process: the engine's own copy, laid out by
    `shardings` (the engine's layout; None: one device), a copy because the update donates the
    trainer's arrays while the engine still decodes (a device_put alone may alias them).
    Several processes: the trainer's arrays themselves; every process publishes the shards it
    holds through the store, so no process gathers the whole model."""
    if jax.process_count() > 1:
        return params
    target = jax.devices()[0] if shardings is None else shardings
    return jax.tree.map(jnp.copy, jax.device_put(params, target))


def read_back(config, shardings, workdir: Path, start: int, params, version: int):
    """Weights `version` (the trainer's newest, `params`, already published) for an engine of
    process 0 laid out by `shardings` (`engine_shardings`): `for_engine`'s copy, or with several
    processes read back from the store."""
    if jax.process_count() == 1:
        return for_engine(params, shardings)
    from c2.rl.weight_sync import WeightSubscriber

    url = orchestrator.store_url(store_url(config, workdir), start)
    sub = WeightSubscriber(url, register=False, shardings=shardings)
    try:
        return sub.fetch(version)[1]
    finally:
        sub.close()
