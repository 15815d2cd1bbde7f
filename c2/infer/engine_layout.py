"""The engine on a mesh: where its weights, slots and KV cache live.

A rollout engine takes a `sharding.Layout` (or a bare mesh: `RULES`) and lays everything out by
its rules, the ones training uses:
  weights   by the model's logical axes (`c2.model.param_shardings`): experts over `expert`,
            heads, mlp and vocab over `tensor`, embed over `fsdp`; the engine keeps them per
            layer (`c2.model.unstack`), each layer's arrays with the layer axis dropped.
  slots     the engine's batch, over the `batch` rule's axes (data, fsdp, expert): the expert
            exchange (`moe.py`) needs each device of an expert group to hold its own tokens.
  KV cache  slots as above; a GQA cache's kv heads over `kv_heads` (tensor), as the k / v
            projections produce them. An MLA cache (latent + rope key) is split by slots only,
            replicated over `tensor`: every head reads the whole latent (that is what MLA
            compresses to), so splitting it by head is impossible, and splitting its rank would
            turn every attention score into a sum across devices.
Context parallelism does not apply (a decode step feeds one token a row): `context` must be 1.
"""

from __future__ import annotations

import functools

import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from c2 import sharding
from c2.model.config import ModelConfig
from c2.model.params import param_shardings
from c2.model.transformer import unstack

# Stacked parameter groups: the ModelConfig field giving each one's layer count.
STACKS = {"dense_layers": "first_k_dense", "moe_layers": "n_moe_layers", "mtp": "mtp_depth"}


def weight_shardings(cfg: ModelConfig, mesh: Mesh | sharding.Layout) -> dict:
    """NamedShardings of the stacked parameter tree (what `Engine(params)` and
    `Engine.update_weights` take, and what a weight store publishes), on the engine's mesh:
    `c2.model.param_shardings` under the layout's rules. A shard a device needs is
    `array[sharding.addressable_devices_indices_map(shape)[device]]`."""
    return param_shardings(cfg, mesh)


def decode_weight_shardings(cfg: ModelConfig, mesh: Mesh | sharding.Layout) -> dict:
    """The shardings of the engine's decoding layout (`unstack`: a list of per-layer trees per
    stack, each array's layer axis dropped)."""
    out = dict(weight_shardings(cfg, mesh))
    drop = lambda s: NamedSharding(s.mesh, P(*s.spec[1:]))  # noqa: E731
    for key, field in STACKS.items():
        if key in out:
            layer = jax.tree.map(drop, out[key])
            out[key] = [layer] * getattr(cfg, field)
    return out


def batch_shards(layout: sharding.Layout | None) -> int:
    """Devices the slots are split over (1 without a mesh)."""
    return sharding.axis_size(layout, sharding.axes_of(layout, "batch")) if layout else 1


def check_layout(cfg: ModelConfig, layout: sharding.Layout, max_slots: int) -> None:
    """Fail before anything compiles, naming the setting, when the mesh cannot run the engine."""
    shape = dict(layout.mesh.shape)
    if shape.get("context", 1) != 1:
        raise ValueError(
            f"engine mesh {shape}: context={shape['context']}, expected 1 (a decode step feeds "
            "one token a row: split slots over data / expert, heads over tensor)"
        )
    n = batch_shards(layout)
    if max_slots % n:
        axes = sharding.axes_of(layout, "batch")
        raise ValueError(
            f"max_slots={max_slots} is not divisible by the mesh axes the slots are split over "
            f"({' x '.join(axes)} = {n}, mesh {shape}): use a multiple of {n}"
        )
    weight_shardings(cfg, layout)  # names the ModelConfig field a mesh axis does not divide
    sharding.check_divisible(
        layout,
        n_experts=cfg.n_experts,
        n_heads=cfg.n_heads,
        n_kv_heads=None if cfg.is_mla else cfg.n_kv_heads,
    )


def state_shardings(state, layout: sharding.Layout):
    """NamedShardings of the engine's state (`steps.init_state`'s tree, or its shapes): every
    array's leading axis is the slots; a GQA cache's [B, S, kv_heads, head_dim] arrays also
    split kv heads; the rest is whole on each of a slot's devices."""

    def one(path, a):
        top = getattr(path[0], "key", None)
        kv = top in ("cache", "mtp_cache") and a.ndim == 4  # GQA k / v: [B, S, Kh, D]
        axes = ("batch", None, "kv_heads", None) if kv else ("batch",) + (None,) * (a.ndim - 1)
        return sharding.named_sharding(layout, axes)

    return jax.tree_util.tree_map_with_path(one, state)


def constrain_state(state, layout: sharding.Layout | None):
    """Pin a step's output state to `state_shardings`: the next call (and its donated buffers)
    sees the layout it was compiled for."""
    if layout is None:
        return state
    return jax.lax.with_sharding_constraint(state, state_shardings(state, layout))


_unstack = jax.jit(unstack)  # one compiled call per weight update, not one slice per leaf


@functools.lru_cache(maxsize=8)
def _unstack_on(cfg: ModelConfig, layout: sharding.Layout):
    return jax.jit(unstack, out_shardings=decode_weight_shardings(cfg, layout))


def place_weights(params, cfg: ModelConfig, layout: sharding.Layout | None):
    """The engine's decoding layout (per layer) of stacked `params`. On a mesh, whatever they
    arrive as (host arrays, one device, another mesh): each leaf goes straight to its shards
    (`device_put` moves only the slices each device holds; no whole copy on one device)."""
    if layout is None:
        return _unstack(params)
    shardings = weight_shardings(cfg, layout)
    got, want = _paths(params), _paths(shardings)
    if got != want:
        raise ValueError(
            f"params do not match the config's parameters: missing {sorted(want - got)}, "
            f"unexpected {sorted(got - want)}"
        )
    return _unstack_on(cfg, layout)(jax.device_put(params, shardings))


def _paths(tree) -> set[str]:
    return {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]}


def to_host(tree):
    """Host (numpy) copies of the engine's device arrays. On a mesh that spans processes (a
    multi-host engine: every process runs the same engine on the same requests, in lockstep)
    each array is gathered to every process first: a collective, which every process reaches at
    the same point of the same step."""
    if all(getattr(a, "is_fully_addressable", True) for a in jax.tree.leaves(tree)):
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)
