"""MXFP8: quantise/dequantise, the block-scaled matmul, and the differentiable training GEMMs.

docs/recipe.md §1 (precision): FP8 E4M3 elements and one E8M0 power-of-two scale per block of
`block_size` (32, the OCP MX standard; 16, the report's setting) consecutive elements along the
contraction axis. The bit-exact block math is in `c2.quant.numerics`.

Layout: `quantize(x, block_size, axis)` returns q with x's shape (float8_e4m3fn) and a scale with
x's shape except `axis`, which has cdiv(n, block_size) entries, stored as float8_e8m0fnu. A length
that is not a multiple of the block size is zero-padded internally: the last block is short.

Training (`mxfp8_dot`, `mxfp8_ragged_dot`, both `custom_vjp`): all three GEMMs of a linear layer run
in MXFP8. The forward saves the high-precision x and w; each backward GEMM re-quantises them (and
the output gradient) along its own contraction axis, because row-wise and column-wise blocks differ
and cannot be derived from each other:
  y  = x @ w      contraction over K: x by rows, w by columns
  dx = dy @ w.T   contraction over M: dy by rows, w by rows
  dw = x.T @ dy   contraction over tokens: x and dy by columns (per expert group for ragged_dot)

Implementations (`impl`):
  "xla"    quantise, dequantise exactly, then an XLA dot with fp32 accumulation. Products of
           dequantised MXFP8 values are exact, so this equals the block-scaled matmul up to the
           order of the fp32 sums. The default everywhere.
  "pallas" the Pallas kernels of `pallas_kernels.mxfp8` (one-pass row+column quantise, FP8
           tensor-core products with per-block scales applied in fp32); interpret mode on CPU.
           Opt-in until `pallas_kernels/bench_gpu.py` has validated it on the target GPU.
Expert GEMMs come in two layouts: `mxfp8_ragged_dot` (`lax.ragged_dot` semantics; "xla" only) and
`mxfp8_tiled_grouped_dot` (each expert's rows padded to whole tiles, the layout of the grouped
Pallas kernels in `pallas_kernels.mxfp8_grouped`; "xla" or "pallas"). Both quantise the weight
gradient's contraction over tokens in blocks that restart at each expert's first row.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import chex
import jax
import jax.numpy as jnp
from jax import lax

from c2.quant import numerics, target
from c2.quant.numerics import E4M3_MAX, ELEMENT_DTYPE, SCALE_DTYPE  # noqa: F401 (public)

DEFAULT_BLOCK_SIZE = 32
IMPLS = ("xla", "pallas")
DEFAULT_IMPL = "xla"


def check_block_size(block_size: Any) -> int:
    """The block size as an int; MX blocks are a power of two of at least 2 elements."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 2:
        raise ValueError(f"block_size={block_size!r}: expected a power-of-two int >= 2 (16 or 32)")
    if block_size & (block_size - 1):
        raise ValueError(f"block_size={block_size}: expected a power of two (16 or 32)")
    return block_size


def _check_float(name: str, x: jnp.ndarray) -> None:
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype.itemsize < 2:
        raise TypeError(f"{name} dtype {x.dtype}: expected float32, bfloat16 or float16")


def _resolve_impl(impl: str | None) -> str:
    impl = DEFAULT_IMPL if impl is None else impl
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r}: expected one of {IMPLS}")
    return impl


def _varying_axes(a) -> frozenset:
    """The shard_map axes `a` varies over (empty outside shard_map)."""
    aval = jax.typeof(a)
    mat = getattr(aval, "manual_axis_type", None)  # jax >= 0.8
    return frozenset(mat.varying if mat is not None else getattr(aval, "vma", ()))


def _vary_like(arrays, *others):
    """`arrays` made varying over every shard_map axis any of arrays/others varies over.

    Inside `jax.shard_map` a custom_vjp's cotangents must have its inputs' types: a replicated
    weight used with sharded tokens is cast to varying first, and autodiff of that cast sums
    (psums) its gradient over the axis, as for any jnp op. A no-op outside shard_map.
    """
    vmas = [_varying_axes(a) for a in (*arrays, *others)]
    union = frozenset().union(*vmas)
    out = []
    for a, vma in zip(arrays, vmas):
        missing = tuple(sorted(union - vma))
        if missing:
            a = (
                lax.pcast(a, missing, to="varying")
                if hasattr(lax, "pcast")
                else lax.pvary(a, missing)
            )
        out.append(a)
    return tuple(out)


def _bits_to_scale(bits: jnp.ndarray) -> jnp.ndarray:
    return lax.bitcast_convert_type(bits.astype(jnp.uint8), SCALE_DTYPE)


def quantize(
    x: jnp.ndarray, block_size: int = DEFAULT_BLOCK_SIZE, axis: int = -1
) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(q float8_e4m3fn like x, scale float8_e8m0fnu with cdiv(n, block_size) along `axis`)."""
    x = jnp.asarray(x)
    _check_float("x", x)
    return _quantize(x, check_block_size(block_size), _normalize_axis(axis, x.ndim, "axis"))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _quantize(x, bs: int, axis: int):
    n = x.shape[axis]
    nb = -(-n // bs)
    x_f32 = jnp.moveaxis(x.astype(jnp.float32), axis, -1)
    lead = x_f32.shape[:-1]
    x_f32 = jnp.pad(x_f32, [(0, 0)] * len(lead) + [(0, nb * bs - n)])
    q, bits = numerics.quantize_blocks(x_f32.reshape(*lead, nb, bs), block_axis=-1)
    q = q.reshape(*lead, nb * bs)[..., :n]
    return jnp.moveaxis(q, -1, axis), jnp.moveaxis(_bits_to_scale(bits[..., 0]), -1, axis)


def dequantize(
    q: jnp.ndarray, scale: jnp.ndarray, block_size: int = DEFAULT_BLOCK_SIZE, axis: int = -1
) -> jnp.ndarray:
    """float32 q * scale, the scale broadcast over its block along `axis`.

    `scale` may be float8_e8m0fnu (what `quantize` returns), uint8 E8M0 bytes (biased exponent),
    or float powers of two.
    """
    bs = check_block_size(block_size)
    axis = _normalize_axis(axis, q.ndim, "axis")
    n = q.shape[axis]
    expected = q.shape[:axis] + (-(-n // bs),) + q.shape[axis + 1 :]
    if scale.shape != expected:
        raise ValueError(
            f"scale shape {scale.shape}: expected {expected} for q {q.shape}, "
            f"block_size={bs}, axis={axis}"
        )
    return _dequantize(q, scale, bs, axis)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _dequantize(q, scale, bs: int, axis: int):
    n = q.shape[axis]
    bits = jnp.repeat(numerics.scale_to_bits(scale), bs, axis=axis)
    bits = lax.slice_in_dim(bits, 0, n, axis=axis)
    return numerics.dequantize_elements(q, bits)


def _normalize_axis(axis: int, ndim: int, name: str) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name}={axis}: out of range for an array of rank {ndim}")
    return axis % ndim


def _dot_dtype() -> jnp.dtype:
    # Dequantised MXFP8 values have 4 significant bits: exact in bf16 (GPU/TPU tensor cores) and
    # in f32 (faster on XLA:CPU). Either way the products are exact and the sums are fp32.
    return jnp.float32 if target.backend() == "cpu" else jnp.bfloat16


def _fake_quant(x: jnp.ndarray, bs: int, axis: int) -> jnp.ndarray:
    """Dequantised MXFP8 image of x along `axis`, in the dot dtype."""
    q, s = quantize(x, bs, axis)
    return dequantize(q, s, bs, axis).astype(_dot_dtype())


def _dot_f32(a: jnp.ndarray, b: jnp.ndarray, dims) -> jnp.ndarray:
    return lax.dot_general(
        a, b, (dims, ((), ())), precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32
    )


def _pallas_kernels(module: str = "mxfp8"):
    try:
        return importlib.import_module(f"pallas_kernels.{module}")
    except ImportError as e:  # the repository's top-level package, installed beside c2
        raise ImportError(
            f"impl='pallas' needs the repository's `pallas_kernels.{module}` "
            "(installed with c2: pip install -e .)"
        ) from e


def mxfp8_matmul(
    a: jnp.ndarray, b: jnp.ndarray, block_size: int = DEFAULT_BLOCK_SIZE, *, impl: str | None = None
) -> jnp.ndarray:
    """float32 a @ b with a [..., K] quantised along its last axis and b [K, N] along its first."""
    bs = check_block_size(block_size)
    impl = _resolve_impl(impl)
    a, b = jnp.asarray(a), jnp.asarray(b)
    _check_float("a", a)
    _check_float("b", b)
    if a.ndim < 1 or b.ndim != 2 or a.shape[-1] != b.shape[0]:
        raise ValueError(f"a {a.shape} @ b {b.shape}: expected a [..., K] and b [K, N]")
    out = _matmul(a.reshape(-1, a.shape[-1]), b, bs, impl, jnp.float32)
    return out.reshape(*a.shape[:-1], b.shape[1])


def _matmul(a_MK, b_KN, bs: int, impl: str, out_dtype) -> jnp.ndarray:
    """a @ b, a quantised by rows and b by columns (both along K), fp32 sums, cast to out_dtype."""
    if impl == "xla":
        out = _dot_f32(_fake_quant(a_MK, bs, 1), _fake_quant(b_KN, bs, 0), ((1,), (0,)))
        return out.astype(out_dtype)
    kernels = _pallas_kernels()
    qa = kernels.quantize(a_MK, bs, rowwise=True, colwise=False)
    qb = kernels.quantize(b_KN, bs, rowwise=False, colwise=True)
    return kernels.matmul_nt(qa.q_row, qa.s_row, qb.q_colT, qb.s_colT, bs, out_dtype=out_dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _dot(x_NK, w_KM, bs, impl):
    return _dot_fwd(x_NK, w_KM, bs, impl)[0]


def _dot_fwd(x_NK, w_KM, bs, impl):
    return _matmul(x_NK, w_KM, bs, impl, x_NK.dtype), (x_NK, w_KM)


def _dot_bwd(bs, impl, res, dy_NM):
    x_NK, w_KM = res
    if impl == "xla":
        dx = _dot_f32(_fake_quant(dy_NM, bs, 1), _fake_quant(w_KM, bs, 1), ((1,), (1,)))
        dw = _dot_f32(_fake_quant(x_NK, bs, 0), _fake_quant(dy_NM, bs, 0), ((0,), (0,)))
    else:
        kernels = _pallas_kernels()
        qdy = kernels.quantize(dy_NM, bs, rowwise=True, colwise=True)  # one pass, both layouts
        qw = kernels.quantize(w_KM, bs, rowwise=True, colwise=False)
        qx = kernels.quantize(x_NK, bs, rowwise=False, colwise=True)
        dx = kernels.matmul_nt(qdy.q_row, qdy.s_row, qw.q_row, qw.s_row, bs, out_dtype=x_NK.dtype)
        dw = kernels.matmul_nt(
            qx.q_colT, qx.s_colT, qdy.q_colT, qdy.s_colT, bs, out_dtype=w_KM.dtype
        )
    return dx.astype(x_NK.dtype), dw.astype(w_KM.dtype)


_dot.defvjp(_dot_fwd, _dot_bwd)


def mxfp8_dot(
    x_NK: jnp.ndarray,
    w_KM: jnp.ndarray,
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    impl: str | None = None,
) -> jnp.ndarray:
    """y = x @ w with all three GEMMs (forward, input- and weight-gradient) in MXFP8.

    x may have leading batch dims ([..., K]); y has x's dtype; accumulation is fp32. K (and the
    token count, the weight-gradient's contraction) need not be multiples of the block size.
    """
    bs = check_block_size(block_size)
    impl = _resolve_impl(impl)
    _check_float("x", x_NK)
    _check_float("w", w_KM)
    if x_NK.ndim < 1 or w_KM.ndim != 2 or x_NK.shape[-1] != w_KM.shape[0]:
        raise ValueError(f"x {x_NK.shape} @ w {w_KM.shape}: expected x [..., K] and w [K, M]")
    x_NK, w_KM = _vary_like((x_NK, w_KM))
    y = _dot(x_NK.reshape(-1, x_NK.shape[-1]), w_KM, bs, impl)
    return y.reshape(*x_NK.shape[:-1], w_KM.shape[1])


# --- grouped GEMM (experts): rows of x sorted by group ------------------------------------------


def grouped_block_ids(group_sizes_G: jnp.ndarray, num_rows: int, block_size: int):
    """(block_id_N int32, num_blocks): blocks of `block_size` rows that never straddle a group.

    Block b of group g covers its rows [b*bs, (b+1)*bs) counted from the group's first row. Rows
    past sum(group_sizes) (ignored by ragged_dot) share the last id, `num_blocks - 1`.
    """
    bs = check_block_size(block_size)
    sizes = group_sizes_G.astype(jnp.int32)
    num_groups = sizes.shape[0]
    group_end = jnp.cumsum(sizes)
    group_start = group_end - sizes
    blocks_per_group = (sizes + bs - 1) // bs
    first_block = jnp.cumsum(blocks_per_group) - blocks_per_group
    # Sum over groups of cdiv(size, bs) <= num_rows // bs + num_groups.
    num_blocks = num_rows // bs + num_groups + 1
    rows = jnp.arange(num_rows, dtype=jnp.int32)
    group = jnp.searchsorted(group_end, rows, side="right").astype(jnp.int32)
    g = jnp.minimum(group, num_groups - 1)
    block = first_block[g] + (rows - group_start[g]) // bs
    return jnp.where(group < num_groups, block, num_blocks - 1).astype(jnp.int32), num_blocks


def quantize_grouped(
    x_NK: jnp.ndarray, group_sizes_G: jnp.ndarray, block_size: int = DEFAULT_BLOCK_SIZE
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Quantise along the rows (tokens) in blocks that restart at each group's first row.

    Returns (q_NK float8_e4m3fn, scale_BK float8_e8m0fnu, block_id_N int32); row n's scale is
    scale_BK[block_id_N[n]]. This is the layout of a weight-gradient's contraction per expert.
    """
    _check_float("x", x_NK)
    chex.assert_rank(x_NK, 2)
    chex.assert_rank(group_sizes_G, 1)
    return _quantize_grouped(x_NK, group_sizes_G, check_block_size(block_size))


@functools.partial(jax.jit, static_argnums=(2,))
def _quantize_grouped(x_NK, group_sizes_G, block_size: int):
    block_id, num_blocks = grouped_block_ids(group_sizes_G, x_NK.shape[0], block_size)
    x_f32 = x_NK.astype(jnp.float32)
    amax_bits = jax.ops.segment_max(numerics.abs_bits(x_f32), block_id, num_segments=num_blocks)
    e_BK = numerics.scale_exponent(jnp.maximum(amax_bits, 0))  # empty segments read as zero
    q = numerics.scaled_elements(x_f32, e_BK[block_id])
    return q, _bits_to_scale(e_BK + numerics.SCALE_BIAS), block_id


def _fake_quant_grouped(x_NK, group_sizes_G, bs):
    q, scale, block_id = quantize_grouped(x_NK, group_sizes_G, bs)
    bits = numerics.scale_to_bits(scale)[block_id]
    return numerics.dequantize_elements(q, bits).astype(_dot_dtype())


def _ragged_f32(x, w, group_sizes):
    return lax.ragged_dot(
        x, w, group_sizes, precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _ragged(x_NK, w_GKM, group_sizes_G, bs):
    return _ragged_fwd(x_NK, w_GKM, group_sizes_G, bs)[0]


def _ragged_fwd(x_NK, w_GKM, group_sizes_G, bs):
    y = _ragged_f32(_fake_quant(x_NK, bs, 1), _fake_quant(w_GKM, bs, 1), group_sizes_G)
    return y.astype(x_NK.dtype), (x_NK, w_GKM, group_sizes_G)


def _ragged_bwd(bs, res, dy_NM):
    x_NK, w_GKM, group_sizes_G = res
    # dx: contraction over M; dy by rows, each expert's weight by rows (along M).
    w_GMK = jnp.swapaxes(_fake_quant(w_GKM, bs, 2), 1, 2)
    dx = _ragged_f32(_fake_quant(dy_NM, bs, 1), w_GMK, group_sizes_G)
    # dw[g] = x_g.T @ dy_g: contraction over each group's tokens, blocks restarting per group.
    x_t = _fake_quant_grouped(x_NK, group_sizes_G, bs)
    dy_t = _fake_quant_grouped(dy_NM, group_sizes_G, bs)
    dw = _grouped_xt_dy(x_t, dy_t, group_sizes_G)
    return dx.astype(x_NK.dtype), dw.astype(w_GKM.dtype), None


def _grouped_xt_dy(x_NK, dy_NM, group_sizes_G):
    """dw[g] = x_g.T @ dy_g [G, K, M]: one ragged GEMM whose contraction (the tokens) is split by
    group, fed in the operands' own dtype (the dequantised MXFP8 images: bf16 on GPU/TPU, where it
    runs at tensor-core rate) with float32 accumulation. Rows past sum(group_sizes) are ignored."""
    dims = lax.RaggedDotDimensionNumbers(
        dot_dimension_numbers=(([0], [0]), ([], [])),
        lhs_ragged_dimensions=[0],
        rhs_group_dimensions=[],
    )
    return lax.ragged_dot_general(
        x_NK, dy_NM, group_sizes_G, dims, preferred_element_type=jnp.float32
    )


_ragged.defvjp(_ragged_fwd, _ragged_bwd)


def mxfp8_ragged_dot(
    x_NK: jnp.ndarray,
    w_GKM: jnp.ndarray,
    group_sizes_G: jnp.ndarray,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> jnp.ndarray:
    """The expert grouped matmul (`jax.lax.ragged_dot` semantics) with all three GEMMs in MXFP8.

    Rows of x are sorted by group; rows past sum(group_sizes) give zeros. Output has x's dtype.
    """
    bs = check_block_size(block_size)
    _check_float("x", x_NK)
    _check_float("w", w_GKM)
    if x_NK.ndim != 2 or w_GKM.ndim != 3 or x_NK.shape[1] != w_GKM.shape[1]:
        raise ValueError(f"x {x_NK.shape}, w {w_GKM.shape}: expected x [N, K] and w [G, K, M]")
    if group_sizes_G.shape != (w_GKM.shape[0],) or not jnp.issubdtype(
        group_sizes_G.dtype, jnp.integer
    ):
        raise ValueError(
            f"group_sizes {group_sizes_G.shape} {group_sizes_G.dtype}: "
            f"expected int [{w_GKM.shape[0]}] (one size per group of w)"
        )
    x_NK, w_GKM = _vary_like((x_NK, w_GKM), group_sizes_G)
    return _ragged(x_NK, w_GKM, group_sizes_G.astype(jnp.int32), bs)


# --- grouped GEMM (experts), tiled layout: every tile of rows belongs to one group --------------


def _quantize_groups(w_GKN, bs: int, rowwise: bool, colwise: bool):
    """The Pallas one-pass quantise of every group's [K, N] matrix (a grid axis per group)."""
    kernels = _pallas_kernels()
    return jax.vmap(
        functools.partial(kernels.quantize, block_size=bs, rowwise=rowwise, colwise=colwise)
    )(w_GKN)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _tiled(x_RK, w_GKN, tile_group_T, bs):
    return _tiled_fwd(x_RK, w_GKN, tile_group_T, bs)[0]


def _tiled_fwd(x_RK, w_GKN, tile_group_T, bs):
    kernels, grouped = _pallas_kernels(), _pallas_kernels("mxfp8_grouped")
    qx = kernels.quantize(x_RK, bs, rowwise=True, colwise=False)
    qw = _quantize_groups(w_GKN.astype(x_RK.dtype), bs, rowwise=False, colwise=True)  # [G,N,K]
    y = grouped.gmm_nt(
        qx.q_row, qx.s_row, qw.q_colT, qw.s_colT, tile_group_T, bs, out_dtype=x_RK.dtype
    )
    return y, (x_RK, w_GKN, tile_group_T)


def _tiled_bwd(bs, res, dy_RN):
    x_RK, w_GKN, tile_group_T = res
    kernels, grouped = _pallas_kernels(), _pallas_kernels("mxfp8_grouped")
    qdy = kernels.quantize(dy_RN, bs, rowwise=True, colwise=True)  # one pass, both layouts
    qw = _quantize_groups(w_GKN.astype(x_RK.dtype), bs, rowwise=True, colwise=False)  # [G,K,N]
    dx = grouped.gmm_nt(
        qdy.q_row, qdy.s_row, qw.q_row, qw.s_row, tile_group_T, bs, out_dtype=x_RK.dtype
    )
    # dw[g] = x_g.T @ dy_g; tiles never straddle groups, so column blocks restart at each group.
    qx = kernels.quantize(x_RK, bs, rowwise=False, colwise=True)
    dw = grouped.tgmm_nt(
        qx.q_colT,
        qx.s_colT,
        qdy.q_colT,
        qdy.s_colT,
        tile_group_T,
        w_GKN.shape[0],
        bs,
        out_dtype=w_GKN.dtype,
    )
    return dx, dw, None


_tiled.defvjp(_tiled_fwd, _tiled_bwd)


def mxfp8_tiled_grouped_dot(
    x_TMK: jnp.ndarray,
    w_GKN: jnp.ndarray,
    tile_group_T: jnp.ndarray,
    block_size: int = DEFAULT_BLOCK_SIZE,
    *,
    impl: str | None = None,
) -> jnp.ndarray:
    """y[t] = x[t] @ w[tile_group[t]] for tiles of M rows, all three GEMMs in MXFP8.

    Tiles are sorted by group (tile_group nondecreasing) and M is a multiple of the block size, so
    the weight gradient's blocks along tokens restart at each group, as in `mxfp8_ragged_dot`.
    w is cast to x's dtype (the compute dtype) before it is quantised; y has x's dtype and dw
    w's, summed over each group's tiles in float32.
    "xla": one `mxfp8_dot` per tile with that tile's gathered weights; "pallas": the grouped
    kernels, which read each tile's weights in place.
    """
    bs = check_block_size(block_size)
    impl = _resolve_impl(impl)
    _check_float("x", x_TMK)
    _check_float("w", w_GKN)
    if x_TMK.ndim != 3 or w_GKN.ndim != 3 or x_TMK.shape[2] != w_GKN.shape[1]:
        raise ValueError(
            f"x {x_TMK.shape}, w {w_GKN.shape}: expected x [tiles, M, K] and w [G, K, N]"
        )
    if tile_group_T.shape != x_TMK.shape[:1] or not jnp.issubdtype(tile_group_T.dtype, jnp.integer):
        raise ValueError(
            f"tile_group {tile_group_T.shape} {tile_group_T.dtype}: "
            f"expected int [{x_TMK.shape[0]}] (one group per tile of x)"
        )
    num_tiles, tile_m, k = x_TMK.shape
    if tile_m % bs:
        raise ValueError(f"x {x_TMK.shape}: tile rows {tile_m} are not a multiple of {bs}")
    tile_group_T = tile_group_T.astype(jnp.int32)
    if impl == "xla":  # gathered in w's dtype, then cast: the tiles' gradients sum in w's dtype
        x_TMK, w_TKN = _vary_like((x_TMK, w_GKN[tile_group_T]))
        return jax.vmap(lambda a, w: _dot(a, w.astype(a.dtype), bs, "xla"))(x_TMK, w_TKN)
    x_TMK, w_GKN = _vary_like((x_TMK, w_GKN), tile_group_T)
    y = _tiled(x_TMK.reshape(num_tiles * tile_m, k), w_GKN, tile_group_T, bs)
    return y.reshape(num_tiles, tile_m, w_GKN.shape[2])
