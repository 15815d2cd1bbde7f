"""Grouped Pallas MXFP8 kernels (interpret mode on CPU) against their jnp references, and the
differentiable tiled grouped dot against `mxfp8_ragged_dot` (the same GEMMs, ragged layout)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_mxfp8_kernels import assert_close, huge_scale_operands, special_matrix

from c2.quant import mxfp8 as mx
from pallas_kernels import mxfp8_grouped as pg


def tiles_of(sizes, tile_m):
    """tile_group [T] and each group's row offset in the padded layout, for group sizes."""
    tiles = -(-np.asarray(sizes) // tile_m)
    return jnp.asarray(np.repeat(np.arange(len(sizes)), tiles), jnp.int32)


def padded_rows(sizes, tile_m):
    """Row index in the padded layout of each of the sum(sizes) sorted rows."""
    tiles = -(-np.asarray(sizes) // tile_m)
    starts = np.concatenate([[0], np.cumsum(tiles * tile_m)[:-1]])
    return np.concatenate([np.arange(s, s + n) for s, n in zip(starts, sizes)]).astype(np.int64)


def rand(shape, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape[:-1] + (1,)))
    return jnp.asarray(x * scale, jnp.float32)


@pytest.mark.parametrize(
    "tile_group,k,n,bs,tiles",
    [
        ([0, 0, 2, 2, 2], 72, 40, 32, (16, 32)),  # an empty group, ragged K and N
        ([1, 1, 1], 64, 48, 16, (16, 32)),  # block 16; groups 0 and 2 empty
        ([0, 1, 2, 3], 128, 16, 32, (16, 64)),  # one tile per group
    ],
)
def test_gmm_nt_equals_reference(tile_group, k, n, bs, tiles):
    tg = jnp.asarray(tile_group, jnp.int32)
    groups, tile_m = 4, 32
    a = rand((len(tile_group) * tile_m, k), 0)
    b = rand((groups, n, k), 1, 1e-2)
    qa, sa = mx.quantize(a, bs, axis=1)
    qb, sb = mx.quantize(b, bs, axis=2)
    run = jax.jit(functools.partial(pg.gmm_nt, block_size=bs, block_n=tiles[0], block_k=tiles[1]))
    assert_close(run(qa, sa, qb, sb, tg), pg.gmm_nt_reference(qa, sa, qb, sb, tg, bs))


def test_gmm_nt_scales_whose_product_leaves_float32():
    """2^100 x 2^40 overflows float32 where the result does not (same accumulation as matmul_nt)."""
    qa, sa, qb, sb = huge_scale_operands(32, 16, 64, 32, 100, 40, 2.0**-9, 2.0**-9, seed=8)
    want = (np.asarray(qa, np.float64) * 2.0**100) @ (np.asarray(qb, np.float64) * 2.0**40).T
    tg = jnp.asarray([0, 1], jnp.int32)  # two row tiles of 16, both experts equal
    got = pg.gmm_nt(qa, sa, jnp.stack([qb, qb]), jnp.stack([sb, sb]), tg, block_n=16, block_k=32)
    assert 0 < np.abs(want).max() < 2.0**127
    assert_close(got, want)


def test_gmm_nt_special_values_and_bf16_output():
    x = jnp.asarray(special_matrix()[:, :63])  # zero blocks, 448/464, subnormals, a ragged K
    x = x.at[60, 60].set(1.0)  # keep the result finite
    tg = jnp.asarray([0, 1], jnp.int32)
    qa, sa = mx.quantize(x, 32, axis=1)
    qb, sb = mx.quantize(rand((2, 24, 63), 2, 1e-3), 32, axis=2)
    got = pg.gmm_nt(qa, sa, qb, sb, tg, out_dtype=jnp.bfloat16, block_n=16, block_k=32)
    assert got.dtype == jnp.bfloat16
    want = pg.gmm_nt_reference(qa, sa, qb, sb, tg, out_dtype=jnp.bfloat16)
    assert_close(got.astype(jnp.float32), want.astype(jnp.float32), rtol=8e-3)


@pytest.mark.parametrize(
    "tile_group,k,n,bs",
    [([0, 0, 2, 2, 2], 72, 40, 32), ([1, 1, 3], 48, 64, 16), ([0, 1, 2, 3], 16, 128, 32)],
)
def test_tgmm_nt_equals_reference_and_zero_for_empty_groups(tile_group, k, n, bs):
    tg = jnp.asarray(tile_group, jnp.int32)
    groups, rows = 4, len(tile_group) * 32
    a = rand((k, rows), 3)
    b = rand((n, rows), 4, 1e-2)
    qa, sa = mx.quantize(a, bs, axis=1)
    qb, sb = mx.quantize(b, bs, axis=1)
    run = jax.jit(functools.partial(pg.tgmm_nt, num_groups=groups, block_size=bs, block_m=16))
    got = run(qa, sa, qb, sb, tg)
    assert got.shape == (groups, k, n)
    assert_close(got, pg.tgmm_nt_reference(qa, sa, qb, sb, tg, groups, bs))
    for g in set(range(groups)) - set(tile_group):
        np.testing.assert_array_equal(got[g], 0.0)


@pytest.mark.parametrize("bs", [16, 32])
def test_tiled_grouped_dot_pallas_equals_xla_and_ragged_dot_with_gradients(bs):
    """y, dx, dw of the tiled layout: the kernels, the per-tile XLA path, and mxfp8_ragged_dot
    on the same rows unpadded (blocks along tokens restart at each group in all three)."""
    sizes, tile_m, k, n = [40, 0, 70, 5], 32, 64, 48
    tg, rows = tiles_of(sizes, tile_m), padded_rows(sizes, tile_m)
    x_r, dy_r = rand((sum(sizes), k), 5), rand((sum(sizes), n), 6)
    w = rand((len(sizes), k, n), 7, 0.1)
    x = jnp.zeros((len(tg) * tile_m, k)).at[rows].set(x_r).reshape(len(tg), tile_m, k)
    dy = jnp.zeros((len(tg) * tile_m, n)).at[rows].set(dy_r).reshape(len(tg), tile_m, n)

    def vjp(f, x, w, dy):
        y, back = jax.vjp(f, x, w)
        return (y, *back(dy))

    results = {
        impl: jax.jit(
            lambda x, w, dy, impl=impl: vjp(
                lambda x, w: mx.mxfp8_tiled_grouped_dot(x, w, tg, bs, impl=impl), x, w, dy
            )
        )(x, w, dy)
        for impl in ("xla", "pallas")
    }
    for got, want in zip(results["pallas"], results["xla"]):
        assert_close(got, want, rtol=1e-5)
    ragged = lambda x, w: mx.mxfp8_ragged_dot(x, w, jnp.asarray(sizes), bs)  # noqa: E731
    y_r, dx_r, dw_r = jax.jit(functools.partial(vjp, ragged))(x_r, w, dy_r)
    y, dx, dw = results["pallas"]
    assert_close(y.reshape(-1, n)[rows], y_r)
    assert_close(dx.reshape(-1, k)[rows], dx_r)
    assert_close(dw, dw_r, rtol=1e-5)


def test_grouped_argument_errors():
    qa, sa = mx.quantize(jnp.ones((64, 32)), 32, axis=1)
    qb, sb = mx.quantize(jnp.ones((2, 16, 32)), 32, axis=2)
    with pytest.raises(ValueError, match=r"tile_group\[1\] = 0 < tile_group\[0\] = 1"):
        pg.gmm_nt(qa, sa, qb, sb, jnp.asarray([1, 0]))
    with pytest.raises(ValueError, match=r"tile_group\[0\] = 2: expected 0 <= group < 2"):
        pg.gmm_nt(qa, sa, qb, sb, jnp.asarray([2, 2]))
    with pytest.raises(ValueError, match="tile_m=8"):
        pg.gmm_nt(qa, sa, qb, sb, jnp.zeros((8,), jnp.int32))
    with pytest.raises(ValueError, match="64 rows: expected a whole number of 3 tiles"):
        pg.gmm_nt(qa, sa, qb, sb, jnp.zeros((3,), jnp.int32))
    with pytest.raises(ValueError, match="contraction sizes"):
        pg.gmm_nt(qa, sa, qb[:, :, :16], sb[:, :, :1], jnp.zeros((2,), jnp.int32))
    q32, s32 = mx.quantize(jnp.ones((16, 64)), 32, axis=1)
    with pytest.raises(ValueError, match="tile_m=16: expected a multiple of block_size=32"):
        pg.tgmm_nt(q32, s32, q32, s32, jnp.zeros((4,), jnp.int32), 1, 32)
    with pytest.raises(ValueError, match="tile rows 48 are not a multiple of 32"):
        mx.mxfp8_tiled_grouped_dot(jnp.ones((2, 48, 32)), jnp.ones((1, 32, 8)), jnp.zeros(2, int))
    with pytest.raises(ValueError, match=r"tile_group \(3,\)"):
        mx.mxfp8_tiled_grouped_dot(jnp.ones((2, 32, 32)), jnp.ones((1, 32, 8)), jnp.zeros(3, int))
