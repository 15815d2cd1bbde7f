"""MXFP8 quantise/dequantise against exact formulas (Fractions / float64 + ml_dtypes rounding)."""

from fractions import Fraction

import chex
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from c2.quant import mxfp8 as mx
from c2.quant import numerics


def exact_exponent(amax: float) -> int:
    """Smallest integer e with amax <= 448 * 2^e (exact rationals), clamped to [-127, 127]."""
    if amax == 0:
        return numerics.ZERO_BLOCK_EXPONENT
    a = Fraction(amax)
    e = a.numerator.bit_length() - a.denominator.bit_length() - 12
    while a > 448 * Fraction(2) ** e:
        e += 1
    return max(-127, min(127, e))


def expected_blocks(x: np.ndarray, bs: int):
    """Reference quantisation of x [..., n] along the last axis: (q as uint8 bits, scale bytes)."""
    n = x.shape[-1]
    nb = -(-n // bs)
    xp = np.zeros(x.shape[:-1] + (nb * bs,), np.float64)
    xp[..., :n] = x.astype(np.float64)
    blocks = xp.reshape(-1, nb, bs)
    q = np.zeros(blocks.shape, ml_dtypes.float8_e4m3fn)
    scale = np.zeros(blocks.shape[:2], np.uint8)
    for r in range(blocks.shape[0]):
        for b in range(nb):
            block = blocks[r, b]
            if not np.all(np.isfinite(block)):
                scale[r, b] = 255
                q[r, b] = np.nan
                continue
            e = exact_exponent(float(np.max(np.abs(block))))
            scale[r, b] = e + 127
            scaled = block / 2.0**e  # exact in float64
            assert np.all(np.abs(scaled) <= 448)
            q[r, b] = scaled.astype(ml_dtypes.float8_e4m3fn)  # round to nearest even
    q = q.reshape(x.shape[:-1] + (nb * bs,))[..., :n]
    return q.view(np.uint8), scale.reshape(x.shape[:-1] + (nb,))


def q_bits(q) -> np.ndarray:
    return np.asarray(q).view(np.uint8)


def scale_bytes(s) -> np.ndarray:
    return np.asarray(s).view(np.uint8)


def edge_blocks(bs: int) -> np.ndarray:
    """Blocks (rows) built around the cases that matter; each row is several blocks long."""
    rng = np.random.default_rng(0)
    f32 = np.float32
    rows = []
    for mag in (1e-38, 1e-30, 1e-6, 1.0, 448.0, 1e6, 1e30, 5e37):
        rows.append(rng.standard_normal(2 * bs) * mag)
    top = [
        448.0,
        np.nextafter(f32(448), f32(1e9)),
        464.0,
        480.0,
        449.0,
        np.nextafter(f32(448), f32(0)),
    ]
    for t in top:  # amax at the saturation edge, the rest spread below it
        rows.append(np.concatenate([[t], rng.uniform(-t, t, 2 * bs - 1)]))
    ties = [1.0625, 1.1875, 2.0**-10, 3 * 2.0**-11, 5 * 2.0**-11, -(2.0**-10), 2.0**-9]
    rows.append(np.concatenate([[448.0], ties, np.zeros(2 * bs - 1 - len(ties))]))  # RNE ties
    rows.append(np.zeros(2 * bs))  # all-zero blocks
    sub = np.array([1e-45, 1e-40, -3e-39, 1.1e-38], np.float32)  # float32 subnormals
    rows.append(np.resize(sub, 2 * bs))
    rows.append(np.concatenate([[1e-20], np.resize(sub, 2 * bs - 1)]))
    rows.append(np.concatenate([[2.0**-117], rng.uniform(-(2.0**-117), 2.0**-117, 2 * bs - 1)]))
    rows.append(np.concatenate([[3.3e38, -3.4e38], rng.standard_normal(2 * bs - 2) * 1e37]))
    rows.append(np.where(np.arange(2 * bs) % 3 == 0, 1e-12, 100.0) * rng.choice([-1, 1], 2 * bs))
    return np.stack(rows).astype(np.float32)


# (block amax, its scale exponent worked out by hand: the smallest e with amax <= 448 * 2^e).
HAND_EXPONENTS = [
    (448.0, 0), (449.0, 1), (464.0, 1), (224.0, -1), (256.0, 0), (1.0, -8), (1e-6, -28),
    (3.0e38, 120), (1e-40, -127), (2.0**-140, -127),  # the last two clamped to E8M0's 2^-127
]  # fmt: skip


@pytest.mark.parametrize("amax,e", HAND_EXPONENTS)
def test_quantize_scale_exponent_matches_hand_values_and_definition(amax, e):
    """The library's scale byte, not the test's helper: hand values, and the definition checked
    with exact rationals (amax fits at e, and would not at e - 1 unless clamped)."""
    x = np.zeros((1, 32), np.float32)
    x[0, 5], x[0, 9] = -amax, amax / 3
    amax32 = Fraction(float(np.float32(amax)))
    _, s = mx.quantize(jnp.asarray(x), 32)
    got = int(scale_bytes(s)[0, 0]) - 127
    assert got == e
    assert amax32 <= 448 * Fraction(2) ** got
    assert got == -127 or amax32 > 448 * Fraction(2) ** (got - 1)
    assert exact_exponent(float(amax32)) == e  # the helper the other tests use agrees


@pytest.mark.parametrize("bs", [16, 32])
def test_quantize_matches_exact_formula(bs):
    x = edge_blocks(bs)
    q, s = mx.quantize(jnp.asarray(x), bs)
    chex.assert_shape(q, x.shape)
    chex.assert_shape(s, (x.shape[0], x.shape[1] // bs))
    assert q.dtype == jnp.float8_e4m3fn and s.dtype == jnp.float8_e8m0fnu
    q_ref, s_ref = expected_blocks(x, bs)
    np.testing.assert_array_equal(scale_bytes(s), s_ref)
    np.testing.assert_array_equal(q_bits(q), q_ref)


def test_quantize_special_blocks():
    x = np.zeros((1, 96), np.float32)
    x[0, 32] = 464.0  # block 1: scale 2
    x[0, 64:96] = 1.0
    x[0, 70] = np.inf  # block 2: non-finite
    q, s = mx.quantize(jnp.asarray(x), 32)
    np.testing.assert_array_equal(scale_bytes(s)[0], [127, 128, 255])  # zero block keeps 2^0
    qf = np.asarray(q.astype(jnp.float32))[0]
    assert np.all(qf[:32] == 0) and qf[32] == 224.0  # 232 ties 224 and 240: even is 224
    assert np.all(np.isnan(qf[64:96]))
    assert np.all(np.isnan(np.asarray(mx.dequantize(q, s, 32))[0, 64:]))


def test_quantize_saturates_at_448_and_never_nan_for_finite_input():
    x = jnp.asarray(edge_blocks(32))
    q, _ = mx.quantize(x, 32)
    qf = np.asarray(q.astype(jnp.float32))
    assert np.all(np.isfinite(qf)) and np.max(np.abs(qf)) == 448.0


@pytest.mark.parametrize(
    "shape,axis,bs", [((3, 40), -1, 32), ((40, 3), 0, 32), ((2, 50, 3), 1, 16), ((7,), 0, 16)]
)
def test_quantize_any_axis_ragged_tail(shape, axis, bs):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-8, 8, shape))).astype(np.float32)
    q, s = mx.quantize(jnp.asarray(x), bs, axis=axis)
    xm = np.moveaxis(x, axis, -1)
    q_ref, s_ref = expected_blocks(xm, bs)
    np.testing.assert_array_equal(np.moveaxis(q_bits(q), axis, -1), q_ref)
    np.testing.assert_array_equal(np.moveaxis(scale_bytes(s), axis, -1), s_ref)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_quantize_half_precision_inputs(dtype):
    x = jnp.asarray(edge_blocks(32)[[2, 3, 4, 14, 15]], dtype)  # inside the half types' ranges
    q, s = mx.quantize(x, 32)
    q_ref, s_ref = expected_blocks(np.asarray(x.astype(jnp.float32)), 32)
    np.testing.assert_array_equal(q_bits(q), q_ref)
    np.testing.assert_array_equal(scale_bytes(s), s_ref)


@pytest.mark.parametrize("bs", [16, 32])
def test_dequantize_exact_and_accepts_every_scale_encoding(bs):
    x = edge_blocks(bs)[1:14]  # scales within the float32 normal range
    q, s = mx.quantize(jnp.asarray(x), bs)
    expected = np.asarray(q.astype(jnp.float32)).astype(np.float64) * np.repeat(
        2.0 ** (scale_bytes(s).astype(np.float64) - 127), bs, axis=1
    )
    d = mx.dequantize(q, s, bs)
    assert d.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(d), expected.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(mx.dequantize(q, jnp.asarray(scale_bytes(s)), bs)), d)
    s_f32 = jnp.asarray(2.0 ** (scale_bytes(s).astype(np.float64) - 127), jnp.float32)
    np.testing.assert_array_equal(np.asarray(mx.dequantize(q, s_f32, bs)), d)


def test_roundtrip_error_within_half_e4m3_ulp():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((64, 96)) * 10.0).astype(np.float32)
    q, s = mx.quantize(jnp.asarray(x), 32)
    d = np.asarray(mx.dequantize(q, s, 32))
    scale = np.repeat(2.0 ** (scale_bytes(s).astype(np.float64) - 127), 32, axis=1)
    y = np.abs(x / scale)
    ulp = np.where(y >= 2.0**-6, 2.0 ** (np.floor(np.log2(np.maximum(y, 2.0**-6))) - 3), 2.0**-9)
    assert np.all(np.abs(d - x) <= ulp * scale / 2)


def test_scale_exponent_exact_over_the_float32_range():
    """2^ceil(log2(amax / 448)) from bits equals the exact rational answer for any amax."""
    rng = np.random.default_rng(3)
    amax = np.abs(rng.standard_normal(4096) * np.exp(rng.uniform(-60, 60, 4096))).astype(np.float32)
    amax[:4] = [448.0, 449.0, 224.0, 1.0]
    expected = np.array([exact_exponent(float(a)) + 127 for a in amax], np.uint8)
    got = numerics.scale_exponent(numerics.abs_bits(jnp.asarray(amax))) + 127
    np.testing.assert_array_equal(np.asarray(got).astype(np.uint8), expected)


def test_quantize_grouped_restarts_blocks_per_group():
    rng = np.random.default_rng(4)
    sizes = np.array([5, 0, 40, 17], np.int32)
    x = (rng.standard_normal((70, 6)) * np.exp(rng.uniform(-5, 5, (70, 1)))).astype(np.float32)
    q, s, block_id = mx.quantize_grouped(jnp.asarray(x), jnp.asarray(sizes), 16)
    qb, sb = q_bits(q), scale_bytes(s)[np.asarray(block_id)]
    start = 0
    for size in sizes:
        if size == 0:
            continue
        rows = slice(start, start + size)
        q_ref, s_ref = expected_blocks(x[rows].T, 16)  # blocks along the group's own tokens
        np.testing.assert_array_equal(qb[rows], q_ref.T)
        np.testing.assert_array_equal(sb[rows], np.repeat(s_ref.T, 16, axis=0)[:size])
        start += size


def test_bad_inputs_raise_clear_errors():
    x = jnp.ones((4, 32))
    with pytest.raises(ValueError, match="block_size=24"):
        mx.quantize(x, 24)
    with pytest.raises(TypeError, match="int32"):
        mx.quantize(jnp.ones((4, 32), jnp.int32))
    with pytest.raises(ValueError, match="axis=2"):
        mx.quantize(x, 32, axis=2)
    q, s = mx.quantize(x, 32)
    with pytest.raises(ValueError, match=r"expected \(4, 1\)"):
        mx.dequantize(q, s[:2], 32)


@pytest.mark.parametrize("bs,axis", [(32, -1), (16, 0)])
def test_quantize_under_jit_matches_exact_formula(bs, axis):
    """Jitted (XLA may fuse and reorder the bit maths) against the exact rational reference."""
    x = edge_blocks(bs)
    x = x if axis == -1 else x.T
    q, s = jax.jit(mx.quantize, static_argnums=(1, 2))(jnp.asarray(x), bs, axis)
    q_ref, s_ref = expected_blocks(x if axis == -1 else x.T, bs)
    if axis == 0:
        q, s = q.T, s.T
    np.testing.assert_array_equal(q_bits(q), q_ref)
    np.testing.assert_array_equal(scale_bytes(s), s_ref)
