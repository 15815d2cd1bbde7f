"""MXFP8 block numerics, bit-exact: E4M3 elements with one E8M0 power-of-two scale per block.

docs/recipe.md §1 (precision): the scale of a block is
2^ceil(log2(amax / 448)), i.e. the smallest power of two with amax <= 448 * scale (rounding up: the
OCP floor rule clips the block maximum and is known to diverge). Elements are x / scale rounded to
the nearest even E4M3 value and saturated to +-448.

Everything here is computed from the float32 bit pattern with integer operations, so the result is
exact on every backend: no inexact `log2`, and no float operation ever sees a float32 subnormal
(XLA:CPU flushes those to zero, which would silently break the scale of tiny blocks). The helpers
take plain `jnp` arrays and use only operations the Pallas Triton lowering supports, so the Pallas
kernels call the very same functions on their tiles.

Scale encoding ("scale bits"): the E8M0 byte, biased exponent e + 127 in [0, 254]; 255 is NaN.
The public arrays carry it as `jnp.float8_e8m0fnu` (a bitcast of the byte).
- all-zero block: scale 2^0 (byte 127); its elements are all 0 whatever the scale.
- block holding an inf or NaN: scale NaN (byte 255) and every element NaN, so the error surfaces.
- exponents are clamped to [-127, 127]: a block whose amax is below 448 * 2^-127 keeps 2^-127.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

E4M3_MAX = 448.0
SCALE_DTYPE = jnp.float8_e8m0fnu
ELEMENT_DTYPE = jnp.float8_e4m3fn
SCALE_BIAS = 127
SCALE_NAN_BITS = 255
ZERO_BLOCK_EXPONENT = 0

_ABS_MASK = 0x7FFFFFFF
_MANTISSA_MASK = 0x007FFFFF
_IMPLICIT_BIT = 0x00800000
_INF_BITS = 0x7F800000
# 448 = 1.75 * 2^8: a normal amax = 1.f * 2^(E-127) fits under 448 * 2^e with e = E - 135 when
# 1.f <= 1.75, i.e. when the 23-bit fraction is <= 0x600000, and needs e = E - 134 otherwise.
_E4M3_MAX_FRACTION = 0x00600000
_E4M3_MAX_EXPONENT_OFFSET = 135
# x = m * 2^k with the integer mantissa m < 2^24; x / scale = m * 2^(k - e) with k - e <= -15 for
# every element of a finite block. Below 2^-60 the product (<= 2^-36) rounds to 0 in E4M3, so the
# shift is clamped there and the power of two stays a normal float32.
_MIN_SHIFT = -60


def abs_bits(x_f32: jnp.ndarray) -> jnp.ndarray:
    """|x| as int32 bits; for non-NaN floats their integer order is the order of magnitudes."""
    return lax.bitcast_convert_type(x_f32, jnp.int32) & _ABS_MASK


def scale_exponent(amax_bits: jnp.ndarray) -> jnp.ndarray:
    """Unbiased int32 exponent e = ceil(log2(amax / 448)) clamped to [-127, 127], from amax's bits.

    Zero blocks get ZERO_BLOCK_EXPONENT; non-finite blocks get 128 (encoded as the NaN byte).
    """
    biased = amax_bits >> 23
    fraction = amax_bits & _MANTISSA_MASK
    e = biased - _E4M3_MAX_EXPONENT_OFFSET + (fraction > _E4M3_MAX_FRACTION).astype(jnp.int32)
    # Subnormal amax (biased == 0) lands below -127 and is clamped like every other tiny block.
    e = jnp.clip(e, -SCALE_BIAS, SCALE_BIAS)
    e = jnp.where(amax_bits == 0, ZERO_BLOCK_EXPONENT, e)
    return jnp.where(amax_bits >= _INF_BITS, SCALE_NAN_BITS - SCALE_BIAS, e)


def pow2(e: jnp.ndarray) -> jnp.ndarray:
    """2^e as float32 for int32 e in [-126, 127], built from its bits (exact)."""
    return lax.bitcast_convert_type((e + SCALE_BIAS) << 23, jnp.float32)


def scaled_elements(x_f32: jnp.ndarray, e: jnp.ndarray) -> jnp.ndarray:
    """E4M3 elements of x / 2^e (round to nearest even, saturated); e broadcasts against x.

    Exact: x is split into an integer mantissa and a power of two so that no float operation sees
    a subnormal; e == 128 (a non-finite block) gives NaN.
    """
    bits = lax.bitcast_convert_type(x_f32, jnp.int32)
    magnitude = bits & _ABS_MASK
    biased = magnitude >> 23
    fraction = magnitude & _MANTISSA_MASK
    is_normal = biased > 0
    mantissa = jnp.where(is_normal, fraction | _IMPLICIT_BIT, fraction)
    k = jnp.where(is_normal, biased, 1) - 150
    shift = jnp.maximum(k - e, _MIN_SHIFT)
    y = mantissa.astype(jnp.float32) * pow2(shift)
    y = jnp.where(bits < 0, -y, y)
    y = jnp.clip(y, -E4M3_MAX, E4M3_MAX)
    y = jnp.where(e > SCALE_BIAS, jnp.float32(jnp.nan), y)
    return y.astype(ELEMENT_DTYPE)


def quantize_blocks(x_f32: jnp.ndarray, block_axis: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Quantise an array whose `block_axis` is one whole block: (q like x, scale bits int32).

    The scale bits keep `block_axis` with size 1 (a keepdims reduction), ready to broadcast.
    """
    e = scale_exponent(jnp.max(abs_bits(x_f32), axis=block_axis, keepdims=True))
    return scaled_elements(x_f32, e), e + SCALE_BIAS


def scale_bits_to_f32(bits: jnp.ndarray) -> jnp.ndarray:
    """E8M0 bytes (any int dtype) -> float32 scale values; byte 0 is the subnormal 2^-127."""
    bits = bits.astype(jnp.int32)
    value_bits = jnp.where(bits == 0, 0x00400000, bits << 23)
    value_bits = jnp.where(bits == SCALE_NAN_BITS, 0x7FC00000, value_bits)
    return lax.bitcast_convert_type(value_bits, jnp.float32)


def scale_to_bits(scale: jnp.ndarray) -> jnp.ndarray:
    """The E8M0 byte (int32) of a scale: float8_e8m0fnu, uint8 bytes, or float powers of two."""
    if scale.dtype == SCALE_DTYPE:
        return lax.bitcast_convert_type(scale, jnp.uint8).astype(jnp.int32)
    if scale.dtype == jnp.uint8:
        return scale.astype(jnp.int32)
    if jnp.issubdtype(scale.dtype, jnp.floating):
        bits = lax.bitcast_convert_type(scale.astype(jnp.float32), jnp.int32)
        exponent = (bits >> 23) & 0xFF
        # 2^-127 is the float32 subnormal 0x00400000; NaN/inf map to the NaN byte.
        exponent = jnp.where(bits == 0x00400000, 0, exponent)
        return jnp.where(exponent == 0xFF, SCALE_NAN_BITS, exponent)
    raise TypeError(
        f"scale dtype {scale.dtype}: expected float8_e8m0fnu, uint8 E8M0 bytes or a float dtype"
    )


def dequantize_elements(q: jnp.ndarray, bits: jnp.ndarray) -> jnp.ndarray:
    """q * 2^(bits - 127) in float32; bits broadcasts against q.

    The power of two is applied in two normal halves so that 2^-127 never enters as a subnormal
    operand; results below the float32 normal range may still flush on backends that flush.
    """
    e = bits.astype(jnp.int32) - SCALE_BIAS
    half = e >> 1
    y = q.astype(jnp.float32) * pow2(half) * pow2(e - half)
    return jnp.where(bits == SCALE_NAN_BITS, jnp.float32(jnp.nan), y)
