"""mxfp8_matmul / mxfp8_dot / mxfp8_ragged_dot against dequantise-then-dot float64 references."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from c2.quant import mxfp8 as mx


def deq(x, bs, axis):
    """float64 image of x after MXFP8 quantisation along `axis` (quantize is tested exactly)."""
    x = jnp.asarray(x)
    return np.asarray(mx.dequantize(*mx.quantize(x, bs, axis), bs, axis), np.float64)


def assert_close(actual, expected, rtol=2e-6):
    """fp32-accumulation agreement, relative to the largest magnitude of the expected result."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    chex.assert_equal_shape([actual, expected])
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.max(np.abs(expected)))


def put(mesh, spec, *arrays):
    return [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, spec)]


def value_and_grads(f, x, w, dy):
    """Jitted (y, dx, dw) of y = f(x, w) for the cotangent dy."""

    def run(x, w, dy):
        y, vjp = jax.vjp(f, x, w)
        return (y, *vjp(dy))

    return jax.jit(run)(x, w, dy)


def rand(shape, seed, scale=1.0, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype)


@pytest.mark.parametrize("bs", [16, 32])
@pytest.mark.parametrize("a_shape,n", [((24, 40), 12), ((2, 3, 72), 20), ((5, 64), 33)])
def test_mxfp8_matmul_equals_dequantised_dot(bs, a_shape, n):
    a, b = rand(a_shape, 0, 3.0), rand((a_shape[-1], n), 1, 1e-3)
    out = mx.mxfp8_matmul(a, b, bs)
    assert out.dtype == jnp.float32
    expected = deq(a, bs, -1).reshape(-1, a_shape[-1]) @ deq(b, bs, 0)
    assert_close(out.reshape(-1, n), expected)


@pytest.mark.parametrize("bs", [16, 32])
def test_mxfp8_matmul_matches_lax_scaled_dot(bs):
    a, b = rand((24, 64), 2, 100.0), rand((64, 40), 3, 1e-2)
    qa, sa = mx.quantize(a, bs, axis=1)
    qb, sb = mx.quantize(b, bs, axis=0)
    ref = jax.lax.scaled_dot(qa, qb, lhs_scale=sa, rhs_scale=sb, preferred_element_type=jnp.float32)
    assert_close(mx.mxfp8_matmul(a, b, bs), ref, rtol=1e-5)


def test_mxfp8_matmul_error_is_mxfp8_sized():
    a, b = rand((64, 256), 4), rand((256, 64), 5)
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    err = np.linalg.norm(np.asarray(mx.mxfp8_matmul(a, b)) - exact) / np.linalg.norm(exact)
    assert 1e-3 < err < 0.05  # quantised (not exact), at the E4M3 precision (2^-4 half-ulp)


def dot_reference(x, w, dy, bs):
    """y, dx, dw of y = x @ w with each GEMM's operands quantised along its contraction axis."""
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
    y = deq(x2, bs, 1) @ deq(w, bs, 0)
    dx = deq(dy2, bs, 1) @ deq(w, bs, 1).T
    dw = deq(x2, bs, 0).T @ deq(dy2, bs, 0)
    return y.reshape(dy.shape), dx.reshape(x.shape), dw


@pytest.mark.parametrize("bs", [16, 32])
def test_mxfp8_dot_forward_and_three_gemm_gradients(bs):
    # K = 40 and M = 24 are not multiples of the block; 10 tokens are not either (dw).
    x, w, dy = rand((2, 5, 40), 6, 2.0), rand((40, 24), 7, 0.1), rand((2, 5, 24), 8, 1e-4)
    y, dx, dw = value_and_grads(lambda x, w: mx.mxfp8_dot(x, w, bs), x, w, dy)
    y_ref, dx_ref, dw_ref = dot_reference(x, w, dy, bs)
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)
    assert_close(dw, dw_ref)
    # ... and they are quantised versions of the exact gradients, not something else.
    dx_exact = np.asarray(dy, np.float64) @ np.asarray(w, np.float64).T
    assert np.linalg.norm(np.asarray(dx) - dx_exact) < 0.1 * np.linalg.norm(dx_exact)


def test_mxfp8_dot_keeps_bf16_inputs_bf16_and_matches_the_reference_under_jit():
    """bf16 in, bf16 out (values and both gradients), each the float64 dequantise-then-dot
    reference rounded once to bf16 (half an ulp: 2^-9 relative)."""
    x, w = rand((6, 32), 9, dtype=jnp.bfloat16), rand((32, 16), 10, dtype=jnp.bfloat16)
    dy = rand((6, 16), 11, 0.1, dtype=jnp.bfloat16)
    y, dx, dw = value_and_grads(mx.mxfp8_dot, x, w, dy)
    assert y.dtype == dx.dtype == dw.dtype == jnp.bfloat16
    f32 = lambda a: a.astype(jnp.float32)
    for got, want in zip((y, dx, dw), dot_reference(f32(x), f32(w), f32(dy), 32)):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2.0**-8, atol=1e-6)


def test_mxfp8_dot_under_shard_map_equals_single_device():
    mesh = jax.make_mesh((8,), ("data",))
    x, w, dy = rand((256, 40), 11), rand((40, 24), 12), rand((256, 24), 13)

    def local(x, w, dy):  # w is replicated: its gradient comes back summed over "data"
        y, vjp = jax.vjp(mx.mxfp8_dot, x, w)
        return (y, *vjp(dy))

    sharded = jax.jit(
        jax.shard_map(
            local,
            mesh=mesh,
            in_specs=(P("data"), P(), P("data")),
            out_specs=(P("data"), P("data"), P()),
        )
    )
    y, dx, dw = sharded(*put(mesh, (P("data"), P(), P("data")), x, w, dy))
    y_1, dx_1, dw_1 = value_and_grads(mx.mxfp8_dot, x, w, dy)
    # Rows quantise independently, and 32 tokens per shard are exactly one token block of dw:
    # the same blocks as on one device, summed in another order.
    for got, want in zip((y, dx, dw), (y_1, dx_1, dw_1)):
        assert_close(got, want)


def ragged_reference(x, w, sizes, dy, bs):
    """y, dx, dw of the grouped matmul, one dense quantised GEMM per group (float64)."""
    n, m = x.shape[0], w.shape[2]
    y, dx, dw = np.zeros((n, m)), np.zeros(x.shape), np.zeros(w.shape)
    xq, dyq = deq(x, bs, 1), deq(dy, bs, 1)
    start = 0
    for g, size in enumerate(sizes):
        rows = slice(start, start + size)
        y[rows] = xq[rows] @ deq(w[g], bs, 0)
        dx[rows] = dyq[rows] @ deq(w[g], bs, 1).T
        if size:  # the weight gradient contracts over this group's tokens only
            dw[g] = deq(x[rows], bs, 0).T @ deq(dy[rows], bs, 0)
        start += size
    return y, dx, dw


@pytest.mark.parametrize("bs", [16, 32])
def test_mxfp8_ragged_dot_matches_per_group_gemms(bs):
    sizes = [10, 0, 30, 3]  # an empty group; 45 - 43 = 2 trailing rows belong to no group
    x, w, dy = rand((45, 40), 14, 3.0), rand((4, 40, 24), 15), rand((45, 24), 16, 1e-3)
    gs = jnp.asarray(sizes, jnp.int32)
    y, dx, dw = value_and_grads(lambda x, w: mx.mxfp8_ragged_dot(x, w, gs, bs), x, w, dy)
    y_ref, dx_ref, dw_ref = ragged_reference(x, w, sizes, dy, bs)
    assert_close(y, y_ref)
    assert_close(dx, dx_ref)
    assert_close(dw, dw_ref)
    assert np.all(np.asarray(y)[43:] == 0) and np.all(np.asarray(dx)[43:] == 0)
    assert np.all(np.asarray(dw)[1] == 0)


def test_mxfp8_ragged_dot_equals_ragged_dot_semantics_for_exact_inputs():
    """Inputs that are exactly representable in MXFP8 give jax.lax.ragged_dot's exact answer."""
    rng = np.random.default_rng(17)
    x = jnp.asarray(rng.integers(-8, 8, (20, 32)), jnp.float32)
    w = jnp.asarray(rng.integers(-8, 8, (3, 32, 16)), jnp.float32)
    gs = jnp.asarray([7, 9, 4], jnp.int32)
    np.testing.assert_array_equal(
        np.asarray(mx.mxfp8_ragged_dot(x, w, gs)), np.asarray(jax.lax.ragged_dot(x, w, gs))
    )


def test_mxfp8_ragged_dot_under_shard_map_equals_per_shard_calls():
    mesh = jax.make_mesh((8,), ("expert",))
    x, w, dy = rand((8 * 16, 32), 18), rand((8, 32, 16), 19), rand((8 * 16, 16), 20)
    gs = jnp.asarray([16, 3, 0, 9, 16, 1, 12, 5], jnp.int32)  # one expert (group) per device

    def local(x, w, gs, dy):
        y, vjp = jax.vjp(lambda x, w: mx.mxfp8_ragged_dot(x, w, gs), x, w)
        return (y, *vjp(dy))

    spec = P("expert")
    outs = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=(spec,) * 3))(
        *put(mesh, (spec,) * 4, x, w, gs, dy)
    )
    outs = [np.asarray(o) for o in outs]
    for d in range(8):
        rows = slice(16 * d, 16 * (d + 1))
        ref = jax.jit(local)(x[rows], w[d : d + 1], gs[d : d + 1], dy[rows])
        for got, want in zip((outs[0][rows], outs[1][rows], outs[2][d : d + 1]), ref):
            assert_close(got, want, rtol=1e-6)


def test_bad_arguments_raise_clear_errors():
    x, w = jnp.ones((4, 32)), jnp.ones((32, 8))
    with pytest.raises(ValueError, match=r"expected x \[..., K\] and w \[K, M\]"):
        mx.mxfp8_dot(x, jnp.ones((16, 8)))
    with pytest.raises(ValueError, match="impl='cuda'"):
        mx.mxfp8_dot(x, w, impl="cuda")
    with pytest.raises(ValueError, match="block_size=0"):
        mx.mxfp8_matmul(x, w, 0)
    with pytest.raises(ValueError, match="one size per group"):
        mx.mxfp8_ragged_dot(x, jnp.ones((2, 32, 8)), jnp.ones((3,), jnp.int32))
