"""The GPU (Triton) versions of the kernels lower on a CPU-only machine.

Cross-platform lowering runs the whole Pallas -> Triton IR translation of every kernel at the
benchmark's shapes, so unsupported operations, non-power-of-two tiles or dtype casts Triton lacks
fail here, without a GPU. (Triton's own compilation to PTX and the numerics need a GPU:
`pallas_kernels/bench_gpu.py`.)
"""

import jax
import jax.numpy as jnp
import pytest

from c2.quant import mxfp8 as mx
from pallas_kernels import mxfp8 as pk
from pallas_kernels import mxfp8_grouped as pg
from pallas_kernels import router_replay as rr

TRITON_CALL = "__gpu$xla.gpu.triton"


def lower_for_cuda(f, *args) -> str:
    try:
        lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    except (ImportError, NotImplementedError) as e:  # jaxlib without the Triton dialect
        if "triton" in str(e).lower():
            pytest.skip(f"no Triton lowering in this jaxlib: {e}")
        raise
    return lowered.as_text()


def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("bs", [16, 32])
def test_quantize_and_matmul_lower_to_triton(bs):
    x = spec((512, 384), jnp.bfloat16)
    text = lower_for_cuda(lambda x: pk.quantize(x, bs, interpret=False), x)
    assert text.count(TRITON_CALL) == 1
    qa, sa = spec((256, 384), jnp.float8_e4m3fn), spec((256, 384 // bs), jnp.float8_e8m0fnu)
    qb, sb = spec((128, 384), jnp.float8_e4m3fn), spec((128, 384 // bs), jnp.float8_e8m0fnu)
    text = lower_for_cuda(
        lambda *ops: pk.matmul_nt(*ops, bs, out_dtype=jnp.bfloat16, interpret=False), qa, sa, qb, sb
    )
    assert text.count(TRITON_CALL) == 1


@pytest.mark.parametrize("bs", [16, 32])
def test_grouped_matmuls_lower_to_triton(bs):
    groups, tiles, tile_m, k, n = 8, 12, 128, 384, 256
    rows = tiles * tile_m
    fp8, e8m0, tg = jnp.float8_e4m3fn, jnp.float8_e8m0fnu, spec((tiles,), jnp.int32)
    gmm = lambda *ops: pg.gmm_nt(*ops, bs, out_dtype=jnp.bfloat16, interpret=False)  # noqa: E731
    operands = (spec((rows, k), fp8), spec((rows, k // bs), e8m0))
    weights = (spec((groups, n, k), fp8), spec((groups, n, k // bs), e8m0))
    assert lower_for_cuda(gmm, *operands, *weights, tg).count(TRITON_CALL) == 1
    tgmm = lambda *ops: pg.tgmm_nt(*ops, groups, bs, interpret=False)  # noqa: E731
    a_t = (spec((k, rows), fp8), spec((k, rows // bs), e8m0))
    b_t = (spec((n, rows), fp8), spec((n, rows // bs), e8m0))
    assert lower_for_cuda(tgmm, *a_t, *b_t, tg).count(TRITON_CALL) == 1


def test_mxfp8_training_ops_lower_to_triton_kernels_only(monkeypatch):
    """Forward + both gradients of the dense and the grouped MXFP8 training ops: every quantise
    and GEMM is a Triton kernel (forward: x by rows, w by columns, 1 GEMM; backward: dy both ways
    in one pass, w by rows, x by columns, 2 GEMMs)."""
    import pallas_kernels

    monkeypatch.setattr(pallas_kernels, "default_interpret", lambda: False)  # as on a GPU
    x, w = spec((256, 384), jnp.bfloat16), spec((384, 512), jnp.bfloat16)

    def dense(x, w):
        return jax.grad(lambda x, w: mx.mxfp8_dot(x, w, impl="pallas").sum(), (0, 1))(x, w)

    assert lower_for_cuda(dense, x, w).count(TRITON_CALL) == 3 + 5
    xt, wg = spec((6, 128, 384), jnp.bfloat16), spec((4, 384, 256), jnp.bfloat16)
    tg = jnp.asarray([0, 0, 1, 3, 3, 3], jnp.int32)

    def grouped(x, w):
        f = lambda x, w: mx.mxfp8_tiled_grouped_dot(x, w, tg, impl="pallas").sum()  # noqa: E731
        return jax.grad(f, (0, 1))(x, w)

    assert lower_for_cuda(grouped, xt, wg).count(TRITON_CALL) == 3 + 5


@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
def test_router_replay_forward_and_backward_lower_to_triton(score_func):
    logits, idx = spec((1000, 256), jnp.bfloat16), spec((1000, 8), jnp.int32)
    kw = dict(
        score_func=score_func, norm_topk_prob=True, routed_scaling_factor=2.5, interpret=False
    )
    text = lower_for_cuda(lambda l, i: rr.router_replay(l, i, **kw), logits, idx)
    assert text.count(TRITON_CALL) == 2  # gates+counts, positions+scatter
    grad = lambda l, i: jax.grad(lambda l: rr.router_replay(l, i, **kw).gates_TK.sum())(l)
    assert lower_for_cuda(grad, logits, idx).count(TRITON_CALL) == 3  # + the backward kernel
