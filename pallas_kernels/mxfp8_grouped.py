"""Pallas MXFP8 grouped matmuls for the experts: the three GEMMs of a grouped (MoE) linear layer.

Layout: "tiles". The rows routed to the experts are sorted by expert and each expert's rows are
padded with zeros to a whole number of tiles of `tile_m` rows (`c2.model.moe` builds this layout),
so that every tile belongs to one expert, `tile_group_T[t]`, nondecreasing over t. Blocks of 32
rows never straddle two experts either, which makes the weight gradient's per-expert contraction
over tokens an ordinary column-wise MXFP8 quantisation of the padded buffer (zero rows change no
block maximum). At most G * (tile_m - 1) rows are padding.

As in `pallas_kernels.mxfp8`, both operands come K-major (contraction axis last) with one E8M0
scale per block of `block_size` along it, and every block's FP8 tensor-core product is scaled in
fp32 by the outer product of its two power-of-two scales. With R = T * tile_m rows:
  gmm_nt:  out[r] = a[r] @ b[g(r)].T              a [R, K], b [G, N, K]   -> [R, N]
           (y = x @ w[g] with b = w[g].T blocked along K; dx = dy @ w[g].T with b = w[g] blocked
           along N)
  tgmm_nt: out[g] = a[:, rows(g)] @ b[:, rows(g)].T   a [K, R], b [N, R]  -> [G, K, N]
           (dw[g] = x_g.T @ dy_g from the column-wise (transposed) x and dy)
`c2.quant.mxfp8.mxfp8_tiled_grouped_dot` composes them into the differentiable training op.

GPU: the Triton backend of Pallas (the expert of a tile is read from `tile_group_T` inside the
kernel, which then indexes that expert's weights). CPU: interpret mode (the default there).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from c2.quant import mxfp8 as mx
from pallas_kernels import resolve_interpret
from pallas_kernels.mxfp8 import (
    _check_operand,
    _compiler_params,
    _pow2_tile,
    _round_up,
    accumulate_blocks,
    matmul_block_size,
    padded_operand,
)


def check_tile_group(tile_group_T, num_groups: int) -> None:
    """Raise a ValueError naming the first tile whose expert is out of range or out of order.

    Runs on concrete values only; with traced ones (inside jit) the caller's layout is trusted.
    """
    try:
        tg = np.asarray(tile_group_T)
    except jax.errors.TracerArrayConversionError:
        return
    bad = np.flatnonzero((tg < 0) | (tg >= num_groups))
    if bad.size:
        t = int(bad[0])
        raise ValueError(f"tile_group[{t}] = {int(tg[t])}: expected 0 <= group < {num_groups}")
    down = np.flatnonzero(np.diff(tg) < 0)
    if down.size:
        t = int(down[0]) + 1
        raise ValueError(
            f"tile_group[{t}] = {int(tg[t])} < tile_group[{t - 1}] = {int(tg[t - 1])}: "
            "tiles must be sorted by group"
        )


def _check_tiles(rows: int, tile_group_T, name: str) -> int:
    if tile_group_T.ndim != 1 or not jnp.issubdtype(tile_group_T.dtype, jnp.integer):
        raise ValueError(f"tile_group {tile_group_T.shape} {tile_group_T.dtype}: expected int [T]")
    num_tiles = tile_group_T.shape[0]
    if num_tiles == 0 or rows % num_tiles:
        raise ValueError(f"{name} has {rows} rows: expected a whole number of {num_tiles} tiles")
    tile_m = rows // num_tiles
    if tile_m < 16 or tile_m & (tile_m - 1):
        raise ValueError(f"tile_m={tile_m}: expected a power of two >= 16 (tensor-core M)")
    return tile_m


# --- gmm: rows grouped by tile -----------------------------------------------------------------


def _gmm_kernel(group_ref, a_ref, sa_ref, b_ref, sb_ref, o_ref, *, bs: int, bk: int, upcast: bool):
    """a_ref [tile_m, Kp] and sa_ref [Kp/bs, tile_m] of this tile; b_ref [G, bn, Kp] and sb_ref
    [G, Kp/bs, bn] hold every expert's slice of this N tile; the tile's expert picks one."""
    g = group_ref[pl.program_id(0)]
    acc = accumulate_blocks(
        lambda kb, cols: (a_ref[:, cols], b_ref[g, :, cols], sa_ref[kb, :], sb_ref[g, kb, :]),
        o_ref.shape,
        first=0,
        steps=a_ref.shape[1] // bk,
        blocks_per_step=bk // bs,
        bs=bs,
        upcast=upcast,
    )
    o_ref[...] = acc.astype(o_ref.dtype)


def gmm_nt(
    qa_RK: jax.Array,
    sa_RKb: jax.Array,
    qb_GNK: jax.Array,
    sb_GNKb: jax.Array,
    tile_group_T: jax.Array,
    block_size: int = mx.DEFAULT_BLOCK_SIZE,
    *,
    out_dtype=jnp.float32,
    block_n: int = 128,
    block_k: int = 128,
    num_warps: int = 8,
    num_stages: int = 3,
    interpret: bool | None = None,
) -> jax.Array:
    """[R, N]: row tile t times expert tile_group[t]'s b, from MXFP8 operands blocked along K."""
    bs = matmul_block_size(block_size)
    _check_operand("a", qa_RK, sa_RKb, bs)
    if qb_GNK.ndim != 3 or sb_GNKb.ndim != 3:
        raise ValueError(f"b {qb_GNK.shape}, scale {sb_GNKb.shape}: expected [groups, N, K]")
    _check_operand(
        "b", qb_GNK.reshape(-1, qb_GNK.shape[2]), sb_GNKb.reshape(-1, sb_GNKb.shape[2]), bs
    )
    if qa_RK.shape[1] != qb_GNK.shape[2]:
        raise ValueError(f"a {qa_RK.shape} and b {qb_GNK.shape}: contraction sizes (K) differ")
    (rows, k), (groups, n, _) = qa_RK.shape, qb_GNK.shape
    tile_m = _check_tiles(rows, tile_group_T, "a")
    check_tile_group(tile_group_T, groups)
    interpret = resolve_interpret(interpret)
    bn = _pow2_tile(block_n, n, 16, "block_n")
    bk = _pow2_tile(block_k, k, bs, "block_k")
    np_, kp = _round_up(n, bn), _round_up(k, bk)
    qa, sa = padded_operand(qa_RK, sa_RKb, rows, kp, bs)
    qb, sb = padded_operand(qb_GNK, sb_GNKb, np_, kp, bs)
    out = pl.pallas_call(
        functools.partial(_gmm_kernel, bs=bs, bk=bk, upcast=bs < 32),
        out_shape=jax.ShapeDtypeStruct((rows, np_), out_dtype),
        grid=(tile_group_T.shape[0], np_ // bn),
        in_specs=[
            pl.BlockSpec(tile_group_T.shape, lambda t, j: (0,)),
            pl.BlockSpec((tile_m, kp), lambda t, j: (t, 0)),
            pl.BlockSpec((kp // bs, tile_m), lambda t, j: (0, t)),
            pl.BlockSpec((groups, bn, kp), lambda t, j: (0, j, 0)),
            pl.BlockSpec((groups, kp // bs, bn), lambda t, j: (0, 0, j)),
        ],
        out_specs=pl.BlockSpec((tile_m, bn), lambda t, j: (t, j)),
        compiler_params=_compiler_params(interpret, num_warps, num_stages),
        interpret=interpret,
        name="mxfp8_gmm_nt",
    )(tile_group_T.astype(jnp.int32), qa, sa, qb, sb)
    return out[:, :n]


def gmm_nt_reference(
    qa_RK,
    sa_RKb,
    qb_GNK,
    sb_GNKb,
    tile_group_T,
    block_size=mx.DEFAULT_BLOCK_SIZE,
    *,
    out_dtype=jnp.float32,
) -> jax.Array:
    """`gmm_nt` in plain jnp: dequantise, gather each tile's expert, one fp32 batched dot."""
    num_tiles = tile_group_T.shape[0]
    a = mx.dequantize(qa_RK, sa_RKb, block_size, axis=1)
    b = mx.dequantize(qb_GNK, sb_GNKb, block_size, axis=2)[tile_group_T]
    a = a.reshape(num_tiles, -1, a.shape[1])
    out = jnp.einsum("tmk,tnk->tmn", a, b, precision=lax.Precision.HIGHEST)
    return out.reshape(-1, b.shape[1]).astype(out_dtype)


# --- tgmm: per-group contraction over rows -----------------------------------------------------


def group_tile_ranges(tile_group_T: jax.Array, num_groups: int) -> tuple[jax.Array, jax.Array]:
    """(first tile, number of tiles) of each group, int32 [G], for tiles sorted by group."""
    counts = jnp.bincount(tile_group_T, length=num_groups).astype(jnp.int32)
    return jnp.cumsum(counts) - counts, counts


def _tgmm_kernel(
    first_ref, count_ref, a_ref, sa_ref, b_ref, sb_ref, o_ref, *, bs: int, tile_m: int, upcast
):
    """a_ref [bm, R] and sa_ref [R/bs, bm]: a K slice of a^T; b_ref [bn, R], sb_ref [R/bs, bn];
    the loop runs over the tiles of group program_id(0) only (none: a zero block)."""
    g = pl.program_id(0)
    acc = accumulate_blocks(
        lambda rb, rows: (a_ref[:, rows], b_ref[:, rows], sa_ref[rb, :], sb_ref[rb, :]),
        o_ref.shape,
        first=first_ref[g],
        steps=count_ref[g],
        blocks_per_step=tile_m // bs,
        bs=bs,
        upcast=upcast,
    )
    o_ref[...] = acc.astype(o_ref.dtype)


def tgmm_nt(
    qa_KR: jax.Array,
    sa_KRb: jax.Array,
    qb_NR: jax.Array,
    sb_NRb: jax.Array,
    tile_group_T: jax.Array,
    num_groups: int,
    block_size: int = mx.DEFAULT_BLOCK_SIZE,
    *,
    out_dtype=jnp.float32,
    block_m: int = 128,
    block_n: int = 128,
    num_warps: int = 8,
    num_stages: int = 3,
    interpret: bool | None = None,
) -> jax.Array:
    """[G, K, N]: per group, a's columns times b's columns over that group's row tiles."""
    bs = matmul_block_size(block_size)
    _check_operand("a", qa_KR, sa_KRb, bs)
    _check_operand("b", qb_NR, sb_NRb, bs)
    if qa_KR.shape[1] != qb_NR.shape[1]:
        raise ValueError(f"a {qa_KR.shape} and b {qb_NR.shape}: contraction sizes (rows) differ")
    (k, rows), n = qa_KR.shape, qb_NR.shape[0]
    tile_m = _check_tiles(rows, tile_group_T, "a.T")
    if tile_m % bs:
        raise ValueError(f"tile_m={tile_m}: expected a multiple of block_size={bs}")
    check_tile_group(tile_group_T, num_groups)
    interpret = resolve_interpret(interpret)
    bm = _pow2_tile(block_m, k, 16, "block_m")
    bn = _pow2_tile(block_n, n, 16, "block_n")
    kp, np_ = _round_up(k, bm), _round_up(n, bn)
    qa, sa = padded_operand(qa_KR, sa_KRb, kp, rows, bs)
    qb, sb = padded_operand(qb_NR, sb_NRb, np_, rows, bs)
    first, count = group_tile_ranges(tile_group_T.astype(jnp.int32), num_groups)
    whole = lambda g, i, j: (0,)  # noqa: E731
    out = pl.pallas_call(
        functools.partial(_tgmm_kernel, bs=bs, tile_m=tile_m, upcast=bs < 32),
        out_shape=jax.ShapeDtypeStruct((num_groups, kp, np_), out_dtype),
        grid=(num_groups, kp // bm, np_ // bn),
        in_specs=[
            pl.BlockSpec((num_groups,), whole),
            pl.BlockSpec((num_groups,), whole),
            pl.BlockSpec((bm, rows), lambda g, i, j: (i, 0)),
            pl.BlockSpec((rows // bs, bm), lambda g, i, j: (0, i)),
            pl.BlockSpec((bn, rows), lambda g, i, j: (j, 0)),
            pl.BlockSpec((rows // bs, bn), lambda g, i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((None, bm, bn), lambda g, i, j: (g, i, j)),
        compiler_params=_compiler_params(interpret, num_warps, num_stages),
        interpret=interpret,
        name="mxfp8_tgmm_nt",
    )(first, count, qa, sa, qb, sb)
    return out[:, :k, :n]


def tgmm_nt_reference(
    qa_KR,
    sa_KRb,
    qb_NR,
    sb_NRb,
    tile_group_T,
    num_groups,
    block_size=mx.DEFAULT_BLOCK_SIZE,
    *,
    out_dtype=jnp.float32,
) -> jax.Array:
    """`tgmm_nt` in plain jnp: dequantise, one fp32 product per tile, summed per group."""
    num_tiles = tile_group_T.shape[0]
    a = mx.dequantize(qa_KR, sa_KRb, block_size, axis=1)
    b = mx.dequantize(qb_NR, sb_NRb, block_size, axis=1)
    a = a.reshape(a.shape[0], num_tiles, -1)
    b = b.reshape(b.shape[0], num_tiles, -1)
    per_tile = jnp.einsum("ktm,ntm->tkn", a, b, precision=lax.Precision.HIGHEST)
    out = jax.ops.segment_sum(per_tile, tile_group_T, num_segments=num_groups)
    return out.astype(out_dtype)
