"""The MXFP8 expert weight gradient (`mxfp8_ragged_dot`'s backward) runs its GEMM on the quantised
operands in the dot dtype (bf16 on GPU/TPU: dequantised MXFP8 values are exact in bf16) with
float32 accumulation, not on float32 copies; and it still equals a float64 reference."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from c2.quant import mxfp8 as mx


def deq(x, bs, axis):
    return np.asarray(mx.dequantize(*mx.quantize(jnp.asarray(x), bs, axis), bs, axis), np.float64)


def dw_reference(x, dy, sizes, bs):
    """float64 dw[g] = deq(x_g).T @ deq(dy_g), blocks along tokens restarting at each group."""
    dw = np.zeros((len(sizes), x.shape[1], dy.shape[1]))
    start = 0
    for g, n in enumerate(sizes):
        if n:
            rows = slice(start, start + n)
            dw[g] = deq(x[rows], bs, 0).T @ deq(dy[rows], bs, 0)
        start += n
    return dw


def _inputs(n_rows=300, k=64, m=48, seed=0):
    rng = np.random.default_rng(seed)
    # Magnitudes spread over a few octaves so that a bf16 accumulation (8 bits) visibly loses
    # what the float32 one keeps.
    x = jnp.asarray(rng.standard_normal((n_rows, k)) * 4.0, jnp.float32)
    dy = jnp.asarray(rng.standard_normal((n_rows, m)) * 1e-2, jnp.float32)
    w = jnp.asarray(rng.standard_normal((4, k, m)) * 0.05, jnp.float32)
    return x, dy, w


def _dw(x, w, dy, sizes, bs):
    gs = jnp.asarray(sizes, jnp.int32)
    _, vjp = jax.vjp(lambda w: mx.mxfp8_ragged_dot(x, w, gs, bs), w)
    return vjp(dy.astype(x.dtype))[0]


@pytest.mark.parametrize("dot_dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("bs", [16, 32])
def test_weight_gradient_equals_float64_reference(monkeypatch, dot_dtype, bs):
    monkeypatch.setattr(mx, "_dot_dtype", lambda: dot_dtype)
    sizes = [97, 0, 150, 41]  # an empty group; 300 - 288 = 12 rows belong to no group
    x, dy, w = _inputs()
    dw = np.asarray(jax.jit(lambda x, w, dy: _dw(x, w, dy, sizes, bs))(x, w, dy), np.float64)
    ref = dw_reference(np.asarray(x), np.asarray(dy), sizes, bs)
    scale = np.max(np.abs(ref))
    # float32 accumulation of exact products over <= 150 rows: ~1e-7 relative. A bf16
    # accumulation (or bf16 output) is off by ~1e-3, a wrong block layout by far more.
    np.testing.assert_allclose(dw, ref, rtol=1e-5, atol=1e-5 * scale)
    assert np.all(dw[1] == 0)


def test_bf16_accumulation_would_fail_the_tolerance():
    """The tolerance above tells float32 from bfloat16 accumulation (the test has teeth)."""
    sizes = [97, 0, 150, 41]
    x, dy, _ = _inputs()
    xt = mx._fake_quant_grouped(x, jnp.asarray(sizes), 32).astype(jnp.bfloat16)
    dyt = mx._fake_quant_grouped(dy, jnp.asarray(sizes), 32).astype(jnp.bfloat16)
    bad = np.asarray(
        mx._grouped_xt_dy(xt, dyt, jnp.asarray(sizes, jnp.int32)).astype(jnp.bfloat16), np.float64
    )
    ref = dw_reference(np.asarray(x), np.asarray(dy), sizes, 32)
    scale = np.max(np.abs(ref))
    assert np.max(np.abs(bad - ref)) > 1e-5 * scale


def test_weight_gradient_gemm_is_fed_in_the_dot_dtype(monkeypatch):
    """With bf16 as the dot dtype (GPU/TPU), the weight-gradient GEMM takes bf16 operands and
    accumulates in float32: no float32 GEMM in the backward pass."""
    monkeypatch.setattr(mx, "_dot_dtype", lambda: jnp.bfloat16)
    sizes = [97, 0, 150, 41]
    x, dy, w = _inputs()
    jaxpr = jax.make_jaxpr(lambda x, w, dy: _dw(x, w, dy, sizes, 32))(x, w, dy)
    gemms = []

    def walk(jx):
        for eqn in jx.eqns:
            if eqn.primitive.name in ("ragged_dot_general", "dot_general"):
                gemms.append(eqn)
            for value in eqn.params.values():
                for sub in value if isinstance(value, tuple | list) else (value,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)

    walk(jaxpr.jaxpr)
    assert gemms, "no GEMM found in the backward pass"
    for eqn in gemms:
        in_dtypes = {v.aval.dtype for v in eqn.invars[:2]}
        assert in_dtypes == {jnp.dtype(jnp.bfloat16)}, (eqn.primitive, in_dtypes)
        assert eqn.params["preferred_element_type"] == jnp.float32
