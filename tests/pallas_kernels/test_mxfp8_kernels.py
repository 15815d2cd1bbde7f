"""Pallas MXFP8 kernels (interpret mode on CPU) against their jnp references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2.quant import mxfp8 as mx
from pallas_kernels import mxfp8 as pk


def bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


def special_matrix() -> np.ndarray:
    """64 x 64 with zero blocks, the 448/464 saturation edge, tiny/huge rows and an inf."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 64)) * np.exp(rng.uniform(-20, 20, (64, 1)))
    x[:16, :32] = 0.0  # zero blocks both ways
    x[20, 3], x[21, 40], x[40:48, 50] = 448.0, 464.0, 449.0
    x[50, :] = 1e-40  # float32 subnormals
    x[51, :] *= 1e-30
    x[60, 60] = np.inf
    return x.astype(np.float32)


@pytest.mark.parametrize(
    "x,bs,tiles",
    [
        (np.random.default_rng(1).standard_normal((40, 72)) * 5, 32, (32, 32)),  # ragged M and K
        (np.random.default_rng(2).standard_normal((48, 40)), 16, (16, 32)),
        (special_matrix(), 32, (32, 32)),
    ],
    ids=["ragged-bs32", "bs16", "special-values"],
)
def test_quantize_kernel_bitwise_equals_reference(x, bs, tiles):
    x = jnp.asarray(x, jnp.float32)
    run = jax.jit(functools.partial(pk.quantize, block_size=bs, block_m=tiles[0], block_k=tiles[1]))
    got, want = run(x), pk.quantize_reference(x, bs)
    for name, g, w in zip(pk.Quantized._fields, got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        np.testing.assert_array_equal(bits(g), bits(w), err_msg=name)


@pytest.mark.parametrize("rowwise,colwise", [(True, False), (False, True)])
def test_quantize_kernel_single_layout_bf16(rowwise, colwise):
    x = jnp.asarray(np.random.default_rng(3).standard_normal((32, 48)), jnp.bfloat16)
    got = pk.quantize(x, 16, rowwise=rowwise, colwise=colwise, block_m=16, block_k=16)
    want = pk.quantize_reference(x, 16, rowwise=rowwise, colwise=colwise)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            np.testing.assert_array_equal(bits(g), bits(w))


def operands(m, n, k, bs, seed):
    rng = np.random.default_rng(seed)
    a = jnp.asarray(rng.standard_normal((m, k)) * np.exp(rng.uniform(-3, 3, (m, 1))), jnp.float32)
    b = jnp.asarray(rng.standard_normal((n, k)) * 0.1, jnp.float32)
    qa, sa = mx.quantize(a, bs, axis=1)
    qb, sb = mx.quantize(b, bs, axis=1)
    return qa, sa, qb, sb


def assert_close(actual, expected, rtol=2e-6):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.max(np.abs(expected)))


def test_matmul_nt_equals_reference_with_padding_and_grouped_tiles():
    # 3 x 2 output tiles walked in groups of 2 rows; K = 72 spans 3 steps of 32, the last ragged.
    ops = operands(40, 24, 72, 32, seed=4)
    run = jax.jit(functools.partial(pk.matmul_nt, block_m=16, block_n=16, block_k=32, group_m=2))
    assert_close(run(*ops), pk.matmul_nt_reference(*ops))


def test_matmul_nt_block16_bf16_output_and_zero_blocks():
    qa, sa, qb, sb = operands(32, 16, 64, 16, seed=5)
    qa = qa.at[:, :16].set(jnp.zeros((32, 16), qa.dtype))  # an all-zero block column
    run = jax.jit(
        functools.partial(
            pk.matmul_nt,
            block_size=16,
            out_dtype=jnp.bfloat16,
            block_m=16,
            block_n=16,
            block_k=32,
        )
    )
    out = run(qa, sa, qb, sb)
    assert out.dtype == jnp.bfloat16
    want = pk.matmul_nt_reference(qa, sa, qb, sb, 16, out_dtype=jnp.bfloat16)
    assert_close(out.astype(jnp.float32), want.astype(jnp.float32), rtol=8e-3)  # bf16 rounding


def huge_scale_operands(m, n, k, bs, sa_exp, sb_exp, a_max, b_max, seed):
    """FP8 elements up to a_max / b_max with E8M0 scale bytes set directly: every a block scaled
    by 2^sa_exp, every b block by 2^sb_exp (no dequantised element overflows)."""
    rng = np.random.default_rng(seed)
    fp8 = np.float32([2.0**-9, 2.0**-6, 0.5, 1.0, 448.0])  # E4M3 subnormal .. max

    def elements(rows, top):
        x = rng.choice(fp8[fp8 <= top], (rows, k)) * rng.choice([-1, 1], (rows, k))
        return jnp.asarray(x, jnp.float8_e4m3fn)

    sa = jnp.full((m, k // bs), 127 + sa_exp, jnp.uint8)
    sb = jnp.full((n, k // bs), 127 + sb_exp, jnp.uint8)
    return elements(m, a_max), sa, elements(n, b_max), sb


@pytest.mark.parametrize(
    "sa_exp,sb_exp,a_max,b_max",
    [
        (100, 40, 2.0**-9, 2.0**-9),  # 2^140 overflows float32; 2^-18 x 2^140 per product does not
        (120, -120, 1.0, 448.0),  # partial (up to 2^14) x 2^120 would overflow before x 2^-120
        (-127, 127, 448.0, 1.0),  # E8M0's smallest and largest
    ],
)
def test_matmul_nt_scales_whose_product_leaves_float32(sa_exp, sb_exp, a_max, b_max):
    """Against float64 numpy: the jnp reference dequantises to float32, where XLA:CPU flushes the
    subnormals that 2^-120 and 2^-127 scales make."""
    qa, sa, qb, sb = huge_scale_operands(32, 16, 64, 32, sa_exp, sb_exp, a_max, b_max, seed=7)
    a = np.asarray(qa, np.float64) * 2.0**sa_exp
    b = np.asarray(qb, np.float64) * 2.0**sb_exp
    want = a @ b.T
    assert 0 < np.abs(want).max() < 2.0**127  # finite in float32, and not all zero
    run = jax.jit(functools.partial(pk.matmul_nt, block_m=16, block_n=16, block_k=32))
    assert_close(run(qa, sa, qb, sb), want)


def test_kernel_matmul_matches_c2_quant_and_lax_scaled_dot():
    rng = np.random.default_rng(6)
    a = jnp.asarray(rng.standard_normal((32, 64)) * 30, jnp.float32)
    b = jnp.asarray(rng.standard_normal((64, 32)) * 1e-3, jnp.float32)
    got = jax.jit(functools.partial(pk.mxfp8_matmul, block_m=16, block_n=16, block_k=64))(a, b)
    assert_close(got, mx.mxfp8_matmul(a, b, impl="xla"))
    qa, sa = mx.quantize(a, 32, axis=1)
    qb, sb = mx.quantize(b, 32, axis=0)
    scaled = jax.lax.scaled_dot(
        qa, qb, lhs_scale=sa, rhs_scale=sb, preferred_element_type=jnp.float32
    )
    assert_close(got, scaled, rtol=1e-5)


def test_mxfp8_dot_pallas_impl_matches_xla_impl_with_gradients():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((20, 40)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((40, 24)) * 0.1, jnp.float32)
    dy = jnp.asarray(rng.standard_normal((20, 24)), jnp.float32)

    def run(impl):
        def f(x, w, dy):
            y, vjp = jax.vjp(lambda x, w: mx.mxfp8_dot(x, w, impl=impl), x, w)
            return (y, *vjp(dy))

        return jax.jit(f)(x, w, dy)

    for got, want in zip(run("pallas"), run("xla")):
        assert_close(got, want)


def test_kernel_argument_errors():
    qa, sa, qb, sb = operands(16, 16, 32, 32, seed=8)
    with pytest.raises(ValueError, match="block_size=8"):
        pk.matmul_nt(*operands(16, 16, 32, 8, seed=8), 8)
    with pytest.raises(ValueError, match="contraction sizes"):
        pk.matmul_nt(qa, sa, qb[:, :16], sb[:, :1])
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        pk.matmul_nt(qa.astype(jnp.float32), sa, qb, sb)
    with pytest.raises(ValueError, match=r"scale \(16, 2\): expected \(16, 1\)"):
        pk.matmul_nt(qa, jnp.concatenate([sa, sa], axis=1), qb, sb)
    with pytest.raises(ValueError, match="block_m=48"):
        pk.quantize(jnp.ones((64, 64)), block_m=48)
    with pytest.raises(ValueError, match="at least one of rowwise, colwise"):
        pk.quantize(jnp.ones((64, 64)), rowwise=False, colwise=False)
