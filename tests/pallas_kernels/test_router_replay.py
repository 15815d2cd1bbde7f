"""Router replay kernel (interpret mode on CPU) against the jnp reference and routing invariants."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from pallas_kernels import router_replay as rr


def routing(t, e, k, seed):
    rng = np.random.default_rng(seed)
    logits = jnp.asarray(rng.standard_normal((t, e)) * 2, jnp.float32)
    idx = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(t)]), jnp.int32)
    return logits, idx


def kernel(block_t=8, **kw):
    return jax.jit(functools.partial(rr.router_replay, block_t=block_t, **kw))


def reference(**kw):
    return jax.jit(functools.partial(rr.router_replay_reference, **kw))


def assert_same_route(got: rr.RouteResult, want: rr.RouteResult):
    np.testing.assert_allclose(np.asarray(got.gates_TK), np.asarray(want.gates_TK), rtol=1e-6)
    for name in ("counts_E", "offsets_E", "sort_idx", "unsort_idx"):
        np.testing.assert_array_equal(
            np.asarray(getattr(got, name)), np.asarray(getattr(want, name)), err_msg=name
        )


def weighted_gates_grad(route_fn, logits, idx):
    t, k = idx.shape
    weights = jnp.cos(jnp.arange(t * k, dtype=jnp.float32)).reshape(t, k)
    return jax.jit(jax.grad(lambda l: jnp.sum(route_fn(l, idx).gates_TK * weights)))(logits)


CONFIGS = [
    # (T, E, K, block_t, score_func, norm_topk_prob, routed_scaling_factor, logits dtype)
    (37, 12, 3, 8, "sigmoid", True, 2.5, jnp.float32),  # ragged token tail, E and K not 2^n
    (37, 12, 3, 16, "softmax", False, 1.0, jnp.float32),
    (16, 64, 8, 8, "sigmoid", False, 1.0, jnp.bfloat16),
    (5, 6, 4, 4, "softmax", True, 0.5, jnp.bfloat16),
]


@pytest.mark.parametrize("t,e,k,bt,score_func,norm,factor,dtype", CONFIGS)
def test_router_replay_matches_reference_with_gradients(
    t, e, k, bt, score_func, norm, factor, dtype
):
    logits, idx = routing(t, e, k, seed=t + e)
    logits = logits.astype(dtype)
    kw = dict(score_func=score_func, norm_topk_prob=norm, routed_scaling_factor=factor)
    got = kernel(bt, **kw)(logits, idx)
    assert_same_route(got, reference(**kw)(logits, idx))
    assert got.gates_TK.dtype == jnp.float32 and got.sort_idx.dtype == jnp.int32
    g_kernel = weighted_gates_grad(kernel(bt, **kw), logits, idx)
    g_ref = weighted_gates_grad(reference(**kw), logits, idx)
    assert g_kernel.dtype == dtype
    tol = 1e-5 if dtype == jnp.float32 else 1e-2
    np.testing.assert_allclose(
        np.asarray(g_kernel, np.float32), np.asarray(g_ref, np.float32), rtol=tol, atol=tol * 1e-2
    )


@pytest.mark.parametrize("score_func,norm", [("sigmoid", True), ("softmax", False)])
def test_gates_only_variant_matches_reference_with_gradients(score_func, norm):
    logits, idx = routing(37, 12, 3, seed=3)
    kw = dict(score_func=score_func, norm_topk_prob=norm, routed_scaling_factor=2.5)
    gates_only = jax.jit(functools.partial(rr.router_replay_gates, block_t=8, **kw))
    want = reference(**kw)(logits, idx)
    np.testing.assert_allclose(gates_only(logits, idx), want.gates_TK, rtol=1e-6)
    g = weighted_gates_grad(lambda l, i: rr.RouteResult(gates_only(l, i), *want[1:]), logits, idx)
    np.testing.assert_allclose(g, weighted_gates_grad(reference(**kw), logits, idx), rtol=1e-5)


def test_gates_follow_deepseek_v3_formula():
    logits, idx = routing(24, 16, 4, seed=1)
    got = kernel(score_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5)(logits, idx)
    s = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
    picked = np.take_along_axis(s, np.asarray(idx), axis=1)
    expected = picked / (picked.sum(1, keepdims=True) + 1e-20) * 2.5
    np.testing.assert_allclose(np.asarray(got.gates_TK), expected, rtol=1e-6)
    # softmax is over all E experts before the gather
    got = kernel(score_func="softmax", norm_topk_prob=False, routed_scaling_factor=1.0)(logits, idx)
    p = np.exp(np.asarray(logits, np.float64))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(
        np.asarray(got.gates_TK), np.take_along_axis(p, np.asarray(idx), axis=1), rtol=1e-5
    )


def test_permutation_groups_pairs_by_expert_stably():
    t, e, k = 45, 7, 3
    logits, idx = routing(t, e, k, seed=2)
    r = kernel(score_func="softmax", norm_topk_prob=True, routed_scaling_factor=1.0)(logits, idx)
    sort_idx, unsort_idx = np.asarray(r.sort_idx), np.asarray(r.unsort_idx)
    flat = np.asarray(idx).reshape(-1)
    np.testing.assert_array_equal(np.sort(sort_idx), np.arange(t * k))  # a permutation
    np.testing.assert_array_equal(unsort_idx[sort_idx], np.arange(t * k))  # and its inverse
    np.testing.assert_array_equal(np.asarray(r.counts_E), np.bincount(flat, minlength=e))
    np.testing.assert_array_equal(
        np.asarray(r.offsets_E),
        np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=e))[:-1]]),
    )
    experts_in_order = flat[sort_idx]
    assert np.all(np.diff(experts_in_order) >= 0)  # grouped by expert
    for ex in range(e):  # stable: each expert's pairs in token order
        assert np.all(np.diff(sort_idx[experts_in_order == ex]) > 0)
    tokens = sort_idx // k  # the grouped buffer gathers these tokens
    np.testing.assert_array_equal(tokens, np.argsort(flat, kind="stable") // k)


def test_bad_indices_inside_jit_are_dropped_not_read_out_of_bounds():
    t, e, k = 20, 8, 3
    logits, idx = routing(t, e, k, seed=3)
    bad = idx.at[3, 1].set(e + 100).at[7, 0].set(-5).at[9, 2].set(idx[9, 0])
    bad = bad.at[11].set(jnp.array([e, e + 1, -1], jnp.int32))  # every slot of token 11 dropped
    kw = dict(score_func="softmax", norm_topk_prob=True, routed_scaling_factor=1.0)
    got = kernel(**kw)(logits, bad)
    assert_same_route(got, reference(**kw)(logits, bad))
    gates, flat = np.asarray(got.gates_TK), np.asarray(bad).reshape(-1)
    dropped = (flat < 0) | (flat >= e)
    assert gates[3, 1] == 0 and gates[7, 0] == 0 and np.all(gates[11] == 0)
    assert int(np.asarray(got.counts_E).sum()) == t * k - dropped.sum()
    # dropped pairs sit after every valid pair, in flat order
    tail = np.asarray(got.sort_idx)[t * k - dropped.sum() :]
    np.testing.assert_array_equal(tail, np.flatnonzero(dropped))
    assert gates[9, 2] == gates[9, 0] > 0  # a repeated expert is routed once per slot
    g = weighted_gates_grad(kernel(**kw), logits, bad)
    np.testing.assert_array_equal(np.asarray(g)[11], 0)


def test_check_routing_names_the_first_bad_slot():
    idx = np.array([[0, 1], [2, 2], [1, 9]])
    with pytest.raises(
        ValueError, match=r"idx_TK\[1, 1\] = 2: expert repeated for token 1 .*slot 0"
    ):
        rr.check_routing(idx, 4)
    with pytest.raises(ValueError, match=r"idx_TK\[1, 1\] = 9: expert index out of range \[0, 4\)"):
        rr.check_routing(idx[[0, 2]], 4)
    with pytest.raises(ValueError, match=r"idx_TK\[0, 0\] = -1"):
        rr.check_routing(np.array([[-1, 0]]), 4)
    rr.check_routing(np.array([[0, 3], [3, 0]]), 4)  # valid: no error
    logits = jnp.zeros((3, 4))
    kw = dict(score_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=1.0)
    with pytest.raises(ValueError, match="expert repeated for token 1"):  # eager calls check
        rr.router_replay(logits, jnp.asarray(idx), **kw)


def test_argument_errors():
    logits, idx = routing(4, 8, 2, seed=4)
    kw = dict(norm_topk_prob=True, routed_scaling_factor=1.0)
    with pytest.raises(ValueError, match="score_func='relu'"):
        rr.router_replay(logits, idx, score_func="relu", **kw)
    with pytest.raises(ValueError, match="token counts"):
        rr.router_replay(logits[:3], idx, score_func="sigmoid", **kw)
    with pytest.raises(ValueError, match="expected int"):
        rr.router_replay(logits, idx.astype(jnp.float32), score_func="sigmoid", **kw)
    with pytest.raises(ValueError, match="block_t=6"):
        rr.router_replay(logits, idx, score_func="sigmoid", block_t=6, **kw)


def test_live_topk_routes_like_deepseek_v3_selection():
    logits, _ = routing(16, 12, 3, seed=5)
    bias = jnp.linspace(-0.5, 0.5, 12)
    idx = rr.live_topk(logits, 3, score_func="sigmoid", correction_bias_E=bias)
    expected = np.argsort(-(1 / (1 + np.exp(-np.asarray(logits))) + np.asarray(bias)), axis=1)[
        :, :3
    ]
    np.testing.assert_array_equal(np.sort(np.asarray(idx), 1), np.sort(expected, 1))
    kw = dict(score_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=1.0)
    assert_same_route(kernel(**kw)(logits, idx), reference(**kw)(logits, idx))


@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
def test_router_replay_gradients_numerically(score_func):
    logits, idx = routing(8, 6, 2, seed=6)
    f = kernel(score_func=score_func, norm_topk_prob=True, routed_scaling_factor=1.5)
    check_grads(lambda l: f(l, idx).gates_TK, (logits,), order=1, modes=["rev"], eps=1e-2)
