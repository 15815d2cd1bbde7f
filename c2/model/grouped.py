"""Grouped expert matmuls over rows sorted by expert: SwiGLU experts as `jax.lax.ragged_dot`
(or the MXFP8 ragged dot), or, where a tiled kernel runs them (the CPU; the grouped Pallas MXFP8
kernels on GPU), each expert's rows padded to whole tiles and run as one batched matmul with
per-tile weights. `c2/model/moe.py` routes and dispatches tokens to them."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from c2.model.config import ModelConfig
from c2.model.layers import einsum_f32
from c2.quant import target

CPU_TILE = 64  # rows per tile of the CPU grouped matmul (a multiple of the MXFP8 block)
KERNEL_TILE = 128  # rows per tile of the grouped Pallas MXFP8 kernels on GPU


# Expert computation ---------------------------------------------------------------------------


def _ragged(x, w, group_sizes, c: ModelConfig):
    dtype = jnp.dtype(c.dtype)
    if c.quant == "mxfp8":
        from c2.quant import mxfp8

        return mxfp8.mxfp8_ragged_dot(
            x.astype(dtype), w.astype(dtype), group_sizes, block_size=c.mxfp8_block_size
        )
    return jax.lax.ragged_dot(
        x.astype(dtype), w.astype(dtype), group_sizes, preferred_element_type=jnp.float32
    ).astype(dtype)


@jax.custom_vjp
def take_rows(x_NH: jax.Array, idx_M: jax.Array, inv_N: jax.Array) -> jax.Array:
    """Rows x[idx] ([M, H]), zero where idx is out of range, for an injective `idx` (each row of x
    taken at most once) whose inverse is `inv` (inv[idx[i]] = i; out of range for rows never
    taken). Its gradient is the gather dy[inv]: XLA would differentiate the gather into a
    scatter-add, which XLA:CPU runs element by element. Same values, same gradients."""
    return x_NH.at[idx_M].get(mode="fill", fill_value=0)


def _take_rows_fwd(x_NH, idx_M, inv_N):
    return take_rows(x_NH, idx_M, inv_N), (idx_M, inv_N)


def _take_rows_bwd(res, dy_MH):
    idx_M, inv_N = res
    return dy_MH.at[inv_N].get(mode="fill", fill_value=0), None, None


take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


def _tile_dot_f32(a, w_tiles, dtype):
    return einsum_f32("tmk,tkn->tmn", a.astype(dtype), w_tiles.astype(dtype)).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _tile_dot(a_tMK, w_EKN, tile_group_t, dtype):
    """Per-tile matmul with each tile's expert weight: a[t] @ w[tile_group[t]].

    The weights are gathered per tile in their own (master) dtype and cast after, so the weight
    gradient sums an expert's tiles in that dtype. Written as a custom VJP so the gathered
    [tiles, K, N] weights are not kept for the backward pass (it gathers them again) and the
    per-tile weight gradients are summed into experts by a one-hot matmul instead of the
    gather's transpose, a scatter-add (both slow on XLA:CPU); the values are the same sums."""
    return _tile_dot_f32(a_tMK, w_EKN[tile_group_t], dtype)


def _tile_dot_fwd(a_tMK, w_EKN, tile_group_t, dtype):
    return _tile_dot(a_tMK, w_EKN, tile_group_t, dtype), (a_tMK, w_EKN, tile_group_t)


def _tile_dot_bwd(dtype, res, dy):
    a_tMK, w_EKN, tile_group_t = res
    _, vjp = jax.vjp(lambda a, w: _tile_dot_f32(a, w, dtype), a_tMK, w_EKN[tile_group_t])
    da, dw_tKN = vjp(dy)
    one_hot = (tile_group_t[None, :] == jnp.arange(w_EKN.shape[0])[:, None]).astype(dw_tKN.dtype)
    dw = jnp.einsum("et,tkn->ekn", one_hot, dw_tKN, precision=jax.lax.Precision.HIGHEST)
    return da, dw.astype(w_EKN.dtype), None


_tile_dot.defvjp(_tile_dot_fwd, _tile_dot_bwd)


def _tiled_grouped_mlp(x_NH, p, group_sizes_G, c: ModelConfig, tile: int):
    """The same grouped SwiGLU as whole tiles: each group is padded to a multiple of `tile` rows,
    every tile belongs to one expert, and the tiles run as one batched matmul with per-tile
    weights. XLA:CPU lowers `ragged_dot` to a slow loop; this keeps CPU runs at matmul speed
    for at most G * (tile - 1) padding rows. Rows move in and out of the tiles by gathers in
    both directions (`take_rows`)."""
    N, H = x_NH.shape
    G = group_sizes_G.shape[0]
    n_tiles = -(-(N + G * (tile - 1)) // tile)
    padded = -(-group_sizes_G // tile) * tile
    pad_end = jnp.cumsum(padded)
    pad_start = pad_end - padded
    row_group = jnp.repeat(jnp.arange(G), group_sizes_G, total_repeat_length=N)
    rank = jnp.arange(N) - (jnp.cumsum(group_sizes_G) - group_sizes_G)[row_group]
    valid = jnp.arange(N) < group_sizes_G.sum()
    dest = jnp.where(valid, pad_start[row_group] + rank, n_tiles * tile)  # invalid rows: cut off
    # src[slot]: the row in each tile slot (N, out of range, for padding slots).
    src = jnp.full((n_tiles * tile,), N, dest.dtype).at[dest].set(jnp.arange(N), mode="drop")
    xt = take_rows(x_NH, src, dest).reshape(n_tiles, tile, H)
    tile_group = jnp.minimum(jnp.searchsorted(pad_end, jnp.arange(n_tiles) * tile, "right"), G - 1)
    dtype = jnp.dtype(c.dtype)

    def mm(a, w):
        if c.quant == "mxfp8":  # per tile = per group: tiles start on group (and block) bounds
            from c2.quant import mxfp8

            return mxfp8.mxfp8_tiled_grouped_dot(
                a.astype(dtype), w, tile_group, block_size=c.mxfp8_block_size, impl=c.mxfp8_impl
            )
        return _tile_dot(a, w, tile_group, dtype)

    h = jax.nn.silu(mm(xt, p["w_gate"])) * mm(xt, p["w_up"])
    yt = mm(h, p["w_down"]).reshape(n_tiles * tile, H)
    return take_rows(yt, dest, src)


def grouped_mlp(x_NH, p, group_sizes_G, c: ModelConfig):
    """SwiGLU experts over rows sorted by expert: [N,H] -> [N,H]; rows past sum(sizes) give 0."""
    if target.backend() == "cpu":
        return _tiled_grouped_mlp(x_NH, p, group_sizes_G, c, tile=CPU_TILE)
    if c.quant == "mxfp8" and c.mxfp8_impl == "pallas":  # the grouped kernels' layout
        return _tiled_grouped_mlp(x_NH, p, group_sizes_G, c, tile=KERNEL_TILE)
    h = jax.nn.silu(_ragged(x_NH, p["w_gate"], group_sizes_G, c))
    h = h * _ragged(x_NH, p["w_up"], group_sizes_G, c)
    return _ragged(h, p["w_down"], group_sizes_G, c)


def _cpu_tiled_rows(n_rows: int, n_groups: int, tile: int = CPU_TILE) -> int:
    """Rows the CPU tiled grouped matmul computes for n_rows sorted rows (padding included)."""
    return -(-(n_rows + n_groups * (tile - 1)) // tile) * tile
