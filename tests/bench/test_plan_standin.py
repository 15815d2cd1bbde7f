"""The plan's grouped-GEMM stand-in (c2.bench.plan.grouped_gemm_standin) against the real expert
grouped matmul on a small case: the same output and gradient shapes and dtypes, and the FLOPs
(XLA's cost_analysis) of a GPU grouped GEMM, 2 M K N per GEMM. With one group XLA:CPU's
`ragged_dot` is that dense GEMM, so there the two compiled costs must agree; with several groups
the CPU lowering multiplies them by the group count and the stand-in does not."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2.bench import plan as plan_lib
from c2.model import grouped, presets
from c2.quant import mxfp8

M, K, N = 256, 64, 32


def _flops(fn, *args) -> float:
    cost = jax.jit(fn).lower(*args).compile().cost_analysis()
    return float((cost[0] if isinstance(cost, list | tuple) else cost)["flops"])


def _operands(groups: int):
    """x, w, group sizes and a cotangent for y (random: a constant one would let XLA simplify)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((groups, K, N)), jnp.bfloat16)
    sizes = jnp.full((groups,), M // groups, jnp.int32)
    dy = jnp.asarray(rng.standard_normal((M, N)), jnp.float32)
    return x, w, sizes, dy


def _fwd_bwd(op):
    """Forward value and both gradients: every GEMM of a training step."""

    def loss(x, w, sizes, dy):
        return jnp.sum(op(x, w, sizes).astype(jnp.float32) * dy)

    return jax.value_and_grad(loss, argnums=(0, 1))


def _bf16_op(x, w, sizes):
    return grouped._ragged(x, w, sizes, presets.get("tiny_kimi_k2", dtype="bfloat16", quant="bf16"))


def _mxfp8_op(x, w, sizes):
    return mxfp8.mxfp8_ragged_dot(x, w, sizes)


@pytest.mark.parametrize("op", [_bf16_op, _mxfp8_op], ids=["bf16", "mxfp8"])
def test_standin_has_the_shapes_and_flops_of_a_grouped_gemm(op):
    x, w, sizes, dy = _operands(1)
    real_y, (_, real_g) = op(x, w, sizes), _fwd_bwd(op)(x, w, sizes, dy)
    real_fwd, real_all = _flops(op, x, w, sizes), _flops(_fwd_bwd(op), x, w, sizes, dy)
    with plan_lib.grouped_gemm_standin():
        y, (_, g) = op(x, w, sizes), _fwd_bwd(op)(x, w, sizes, dy)
        fwd, total = _flops(op, x, w, sizes), _flops(_fwd_bwd(op), x, w, sizes, dy)
        many_total = _flops(_fwd_bwd(op), *_operands(8))
    assert (y.shape, y.dtype) == (real_y.shape, real_y.dtype)
    for a, b in zip(g, real_g):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)
    gemm = 2 * M * K * N
    assert fwd >= gemm and total >= 3 * gemm  # forward; + input and weight gradients
    np.testing.assert_allclose(fwd, real_fwd, rtol=0.05)
    np.testing.assert_allclose(total, real_all, rtol=0.05)
    # Eight groups: the stand-in's GEMMs stay those of M rows (MXFP8 adds the quantise of 8x the
    # weights, elementwise); the CPU lowering's cost grows ~8x.
    assert many_total < 1.3 * total, (many_total, total)
    assert _flops(_fwd_bwd(op), *_operands(8)) > 4 * real_all
