"""Pallas MXFP8 kernels: one-pass row+column quantise, and the block-scaled FP8 matmul.

Both operands of every GEMM are handed over with the contraction axis last ("NT" layout, K-major,
what FP8 tensor cores want): `quantize` writes the row-wise result [M, K] (blocks along K) and the
column-wise result transposed, [K, M] (blocks along M), from one read of each tile. With them the
three GEMMs of a linear layer (`c2.quant.mxfp8`) are all `matmul_nt`:
  y  = x @ w     : matmul_nt(rows(x),  colT(w))
  dx = dy @ w.T  : matmul_nt(rows(dy), rows(w))
  dw = x.T @ dy  : matmul_nt(colT(x), colT(dy))

`matmul_nt` tiles M and N over the grid (grouped launch order for L2 reuse) and loops over K. Each
32-element K block is one FP8 tensor-core product of the two [tile, 32] operands in fp32, multiplied
by the outer product of the two blocks' power-of-two scales and added to the fp32 accumulator:
Hopper has no hardware MX support, so the scales are applied in software per partial product, as
DeepSeek-V3 does per 128. Block size 16 is supported with the operands upcast to bf16 per product
(exact), since FP8 tensor-core products need K >= 32.

GPU: the Triton backend of Pallas. CPU: interpret mode (the default there). The quantise math is
`c2.quant.numerics`, the same bit-exact functions as the reference `c2.quant.mxfp8.quantize`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from c2.quant import mxfp8 as mx
from c2.quant import numerics
from pallas_kernels import resolve_interpret

try:  # the Triton backend of Pallas; absent from CPU-only jaxlib builds of some versions
    from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
    plgpu = None


class Quantized(NamedTuple):
    """MXFP8 operands of an [M, K] tensor; fields not requested are None."""

    q_row: jax.Array | None  # [M, K] float8_e4m3fn, blocks along K
    s_row: jax.Array | None  # [M, cdiv(K, bs)] float8_e8m0fnu
    q_colT: jax.Array | None  # [K, M] float8_e4m3fn, blocks along M, stored transposed
    s_colT: jax.Array | None  # [K, cdiv(M, bs)] float8_e8m0fnu


def _compiler_params(interpret: bool, num_warps: int, num_stages: int):
    if interpret or plgpu is None:
        return None
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _pow2_tile(requested: int, size: int, minimum: int, name: str) -> int:
    if requested < minimum or requested & (requested - 1):
        raise ValueError(f"{name}={requested}: expected a power of two >= {minimum}")
    return min(requested, max(minimum, pl.next_power_of_2(size)))


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _bits_to_scale(bits: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(bits.astype(jnp.uint8), numerics.SCALE_DTYPE)


# --- quantise ------------------------------------------------------------------------------------


def _quantize_rows(x_f32: jax.Array, bs: int) -> tuple[jax.Array, jax.Array]:
    rows, cols = x_f32.shape
    q, bits = numerics.quantize_blocks(x_f32.reshape(rows, cols // bs, bs), block_axis=2)
    return q.reshape(rows, cols), bits.reshape(rows, cols // bs).astype(jnp.uint8)


def _quantize_kernel(x_ref, *out_refs, bs: int, rowwise: bool, colwise: bool):
    x = x_ref[...].astype(jnp.float32)
    refs = iter(out_refs)
    if rowwise:
        q, bits = _quantize_rows(x, bs)
        next(refs)[...] = q
        next(refs)[...] = bits
    if colwise:  # column blocks of x are row blocks of x.T: written transposed, K-major
        q, bits = _quantize_rows(x.T, bs)
        next(refs)[...] = q
        next(refs)[...] = bits


def quantize(
    x_MK: jax.Array,
    block_size: int = mx.DEFAULT_BLOCK_SIZE,
    *,
    rowwise: bool = True,
    colwise: bool = True,
    block_m: int = 64,
    block_k: int = 64,
    num_warps: int = 4,
    interpret: bool | None = None,
) -> Quantized:
    """MXFP8 quantise of a 2-D tensor along its rows and/or columns in one pass over the tiles."""
    bs = mx.check_block_size(block_size)
    if x_MK.ndim != 2 or not jnp.issubdtype(x_MK.dtype, jnp.floating):
        raise ValueError(f"x {x_MK.shape} {x_MK.dtype}: expected a 2-D float array")
    if not (rowwise or colwise):
        raise ValueError("quantize: at least one of rowwise, colwise must be True")
    interpret = resolve_interpret(interpret)
    m, k = x_MK.shape
    bm = _pow2_tile(block_m, m, bs, "block_m")
    bk = _pow2_tile(block_k, k, bs, "block_k")
    mp, kp = _round_up(m, bm), _round_up(k, bk)
    x = jnp.pad(x_MK, ((0, mp - m), (0, kp - k)))

    out_shape, out_specs = [], []
    if rowwise:
        out_shape += [
            jax.ShapeDtypeStruct((mp, kp), numerics.ELEMENT_DTYPE),
            jax.ShapeDtypeStruct((mp, kp // bs), jnp.uint8),
        ]
        out_specs += [
            pl.BlockSpec((bm, bk), lambda i, j: (i, j)),
            pl.BlockSpec((bm, bk // bs), lambda i, j: (i, j)),
        ]
    if colwise:
        out_shape += [
            jax.ShapeDtypeStruct((kp, mp), numerics.ELEMENT_DTYPE),
            jax.ShapeDtypeStruct((kp, mp // bs), jnp.uint8),
        ]
        out_specs += [
            pl.BlockSpec((bk, bm), lambda i, j: (j, i)),
            pl.BlockSpec((bk, bm // bs), lambda i, j: (j, i)),
        ]
    outs = pl.pallas_call(
        functools.partial(_quantize_kernel, bs=bs, rowwise=rowwise, colwise=colwise),
        out_shape=out_shape,
        grid=(mp // bm, kp // bk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j: (i, j))],
        out_specs=out_specs,
        compiler_params=_compiler_params(interpret, num_warps, num_stages=1),
        interpret=interpret,
        name="mxfp8_quantize",
    )(x)
    outs = iter(outs)
    q_row = s_row = q_colT = s_colT = None
    if rowwise:
        q_row = next(outs)[:m, :k]
        s_row = _bits_to_scale(next(outs)[:m, : -(-k // bs)])
    if colwise:
        q_colT = next(outs)[:k, :m]
        s_colT = _bits_to_scale(next(outs)[:k, : -(-m // bs)])
    return Quantized(q_row, s_row, q_colT, s_colT)


def quantize_reference(
    x_MK: jax.Array,
    block_size: int = mx.DEFAULT_BLOCK_SIZE,
    *,
    rowwise: bool = True,
    colwise: bool = True,
) -> Quantized:
    """`quantize` in plain jnp: `c2.quant.mxfp8.quantize` along each axis."""
    q_row = s_row = q_colT = s_colT = None
    if rowwise:
        q_row, s_row = mx.quantize(x_MK, block_size, axis=1)
    if colwise:
        q_col, s_col = mx.quantize(x_MK, block_size, axis=0)
        q_colT, s_colT = q_col.T, s_col.T
    return Quantized(q_row, s_row, q_colT, s_colT)


# --- block-scaled matmul ------------------------------------------------------------------------


def _grouped_tile(pid, num_m: int, num_n: int, group_m: int):
    """(i, j) of program `pid`, walking group_m rows of tiles at a time (L2 reuse of b)."""
    width = group_m * num_n
    first_m = (pid // width) * group_m
    size_m = jnp.minimum(num_m - first_m, group_m)
    i = first_m + (pid % width) % size_m
    j = (pid % width) // size_m
    return i, j


def _half_scales(bits, round_up: bool) -> tuple[jax.Array, jax.Array]:
    """(2^h, 2^(e-h)) float32 for E8M0 bytes 2^e, h = ceil(e/2) or floor(e/2): each in
    [2^-64, 2^64]. A NaN byte (255) stays NaN in the first."""
    bias, bits = numerics.SCALE_BIAS, bits.astype(jnp.int32)
    e = bits - bias
    h = lax.shift_right_arithmetic(e + int(round_up), jnp.int32(1))
    first = jnp.where(bits == numerics.SCALE_NAN_BITS, bits, h + bias)
    return numerics.scale_bits_to_f32(first), numerics.scale_bits_to_f32(e - h + bias)


def scaled_block_product(a, b, sa_bits, sb_bits, upcast: bool) -> jax.Array:
    """fp32 [m, n] = (a * 2^sa) @ (b * 2^sb).T for one K block: a [m, bs], b [n, bs] FP8 elements,
    sa_bits [m] and sb_bits [n] their E8M0 bytes. The FP8 product runs on the tensor cores; the two
    power-of-two scales multiply the fp32 partial product (exact).

    2^sa * 2^sb reaches 2^254, past float32, and (partial * 2^sa) * 2^sb can overflow while the
    result is finite (2^120 * 2^-120); so the product of the scales is applied in two halves,
    2^(ceil(sa/2) + floor(sb/2)) then the rest, each within [2^-127, 2^127]: no intermediate
    overflows unless the result does."""
    if upcast:
        a, b = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    partial = lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    a1, a2 = _half_scales(sa_bits, round_up=True)
    b1, b2 = _half_scales(sb_bits, round_up=False)
    return partial * (a1[:, None] * b1[None, :]) * (a2[:, None] * b2[None, :])


def accumulate_blocks(operands, shape, *, first, steps, blocks_per_step: int, bs: int, upcast):
    """fp32 [shape] sum of `scaled_block_product` over the K blocks (first + s) * blocks_per_step
    + j for s < steps (a traced count is fine) and j < blocks_per_step (unrolled).

    `operands(kb, cols)` returns (a [m, bs], b [n, bs], sa_bits [m], sb_bits [n]) of K block kb,
    whose elements are `cols` = pl.ds(kb * bs, bs) along the contraction axis.
    """

    def step(s, acc):
        for j in range(blocks_per_step):
            kb = (first + s) * blocks_per_step + j
            cols = pl.ds(pl.multiple_of(kb * bs, bs), bs)
            acc = acc + scaled_block_product(*operands(kb, cols), upcast)
        return acc

    return lax.fori_loop(0, steps, step, jnp.zeros(shape, jnp.float32))


def _matmul_kernel(a_ref, sa_ref, b_ref, sb_ref, o_ref, *, bs: int, bk: int, upcast: bool):
    """a_ref [bm, Kp], sa_ref [Kp/bs, bm] (scale bytes), b_ref [bn, Kp], sb_ref [Kp/bs, bn]."""
    acc = accumulate_blocks(
        lambda kb, cols: (a_ref[:, cols], b_ref[:, cols], sa_ref[kb, :], sb_ref[kb, :]),
        o_ref.shape,
        first=0,
        steps=a_ref.shape[1] // bk,
        blocks_per_step=bk // bs,
        bs=bs,
        upcast=upcast,
    )
    o_ref[...] = acc.astype(o_ref.dtype)


def matmul_block_size(block_size) -> int:
    """The block size of a matmul kernel: an MX block size of at least 16 (tensor-core K)."""
    bs = mx.check_block_size(block_size)
    if bs < 16:
        raise ValueError(f"block_size={bs}: the matmul kernel needs >= 16 (tensor-core K)")
    return bs


def _check_operand(name: str, q: jax.Array, s: jax.Array, bs: int) -> None:
    if q.ndim != 2 or q.dtype != numerics.ELEMENT_DTYPE:
        raise ValueError(f"{name} {q.shape} {q.dtype}: expected a 2-D float8_e4m3fn array")
    expected = (q.shape[0], -(-q.shape[1] // bs))
    if s.shape != expected:
        raise ValueError(f"{name} scale {s.shape}: expected {expected} for block_size={bs}")


def padded_operand(q, s, rows_p: int, kp: int, bs: int) -> tuple[jax.Array, jax.Array]:
    """(q [..., rows_p, kp], scale bytes [..., kp/bs, rows_p]) of an operand blocked along its last
    axis: zero elements with scale 1 in the padding, and the scales transposed so that a kernel
    reads one contiguous row of them per K block."""
    lead = [(0, 0)] * (q.ndim - 2)
    bits = numerics.scale_to_bits(s).astype(jnp.uint8)
    q = jnp.pad(q, (*lead, (0, rows_p - q.shape[-2]), (0, kp - q.shape[-1])))
    bits = jnp.pad(
        bits,
        (*lead, (0, rows_p - bits.shape[-2]), (0, kp // bs - bits.shape[-1])),
        constant_values=numerics.SCALE_BIAS,
    )
    return q, jnp.swapaxes(bits, -1, -2)


def matmul_nt(
    qa_MK: jax.Array,
    sa_MKb: jax.Array,
    qb_NK: jax.Array,
    sb_NKb: jax.Array,
    block_size: int = mx.DEFAULT_BLOCK_SIZE,
    *,
    out_dtype=jnp.float32,
    block_m: int = 128,
    block_n: int = 128,
    block_k: int = 128,
    group_m: int = 8,
    num_warps: int = 8,
    num_stages: int = 3,
    interpret: bool | None = None,
) -> jax.Array:
    """[M, N] = dequant(qa) @ dequant(qb).T from MXFP8 operands blocked along their last axis.

    Partial products per K block in fp32 on FP8 tensor cores, scaled and accumulated in fp32.
    """
    bs = matmul_block_size(block_size)
    _check_operand("a", qa_MK, sa_MKb, bs)
    _check_operand("b", qb_NK, sb_NKb, bs)
    if qa_MK.shape[1] != qb_NK.shape[1]:
        raise ValueError(f"a {qa_MK.shape} and b {qb_NK.shape}: contraction sizes (K) differ")
    interpret = resolve_interpret(interpret)
    (m, k), n = qa_MK.shape, qb_NK.shape[0]
    bm = _pow2_tile(block_m, m, 16, "block_m")
    bn = _pow2_tile(block_n, n, 16, "block_n")
    bk = _pow2_tile(block_k, k, bs, "block_k")
    mp, np_, kp = _round_up(m, bm), _round_up(n, bn), _round_up(k, bk)

    qa, sa = padded_operand(qa_MK, sa_MKb, mp, kp, bs)
    qb, sb = padded_operand(qb_NK, sb_NKb, np_, kp, bs)
    num_m, num_n = mp // bm, np_ // bn
    tile = functools.partial(_grouped_tile, num_m=num_m, num_n=num_n, group_m=group_m)
    out = pl.pallas_call(
        functools.partial(_matmul_kernel, bs=bs, bk=bk, upcast=bs < 32),
        out_shape=jax.ShapeDtypeStruct((mp, np_), out_dtype),
        grid=(num_m * num_n,),
        in_specs=[
            pl.BlockSpec((bm, kp), lambda p: (tile(p)[0], 0)),
            pl.BlockSpec((kp // bs, bm), lambda p: (0, tile(p)[0])),
            pl.BlockSpec((bn, kp), lambda p: (tile(p)[1], 0)),
            pl.BlockSpec((kp // bs, bn), lambda p: (0, tile(p)[1])),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda p: tile(p)),
        compiler_params=_compiler_params(interpret, num_warps, num_stages),
        interpret=interpret,
        name="mxfp8_matmul_nt",
    )(qa, sa, qb, sb)
    return out[:m, :n]


def matmul_nt_reference(
    qa_MK: jax.Array,
    sa_MKb: jax.Array,
    qb_NK: jax.Array,
    sb_NKb: jax.Array,
    block_size: int = mx.DEFAULT_BLOCK_SIZE,
    *,
    out_dtype=jnp.float32,
) -> jax.Array:
    """`matmul_nt` in plain jnp: dequantise both operands, then one fp32 dot."""
    a = mx.dequantize(qa_MK, sa_MKb, block_size, axis=1)
    b = mx.dequantize(qb_NK, sb_NKb, block_size, axis=1)
    out = lax.dot_general(
        a,
        b,
        (((1,), (1,)), ((), ())),
        precision=lax.Precision.HIGHEST,
        preferred_element_type=jnp.float32,
    )
    return out.astype(out_dtype)


def mxfp8_matmul(
    a_MK: jax.Array, b_KN: jax.Array, block_size: int = mx.DEFAULT_BLOCK_SIZE, **kwargs
) -> jax.Array:
    """float32 a @ b through the kernels: a quantised by rows, b by columns, then `matmul_nt`."""
    interpret = kwargs.pop("interpret", None)
    qa = quantize(a_MK, block_size, rowwise=True, colwise=False, interpret=interpret)
    qb = quantize(b_KN, block_size, rowwise=False, colwise=True, interpret=interpret)
    return matmul_nt(
        qa.q_row, qa.s_row, qb.q_colT, qb.s_colT, block_size, interpret=interpret, **kwargs
    )
