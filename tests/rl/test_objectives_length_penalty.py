"""Length penalty C(k, q)(x) and the effort measure x."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2.rl.objectives import EffortWeights, effort, length_penalty

X = jnp.array([0.0, 1.0, 10.0, 250.0, 4000.0, 64000.0])
K = 1e-3


@pytest.mark.parametrize(
    "q, closed_form",
    [
        (0.0, lambda x, k: x),  # linear
        (0.5, lambda x, k: 2.0 * (np.sqrt(1 + k * x) - 1) / k),
        (1.0, lambda x, k: np.log1p(k * x) / k),  # the limit
        (2.0, lambda x, k: x / (1 + k * x)),  # bounded by 1 / k
        (-1.0, lambda x, k: ((1 + k * x) ** 2 - 1) / (2 * k)),  # convex, for contrast
    ],
)
def test_known_values(q, closed_form):
    x = np.asarray(X, np.float64)
    np.testing.assert_allclose(length_penalty(X, K, q), closed_form(x, K), rtol=2e-6)


def test_worked_example():
    # k = 0.01, q = 0.5, x = 300: (sqrt(4) - 1) / (0.01 * 0.5) = 200
    assert float(length_penalty(300.0, 0.01, 0.5)) == pytest.approx(200.0, rel=1e-6)


def _grid():
    return jnp.linspace(0.0, 20000.0, 401)


@pytest.mark.parametrize("k", [1e-4, 1e-3, 1e-2])
@pytest.mark.parametrize("q", [0.0, 0.3, 1.0, 1.7, 3.0])
def test_monotone_increasing(k, q):
    slope = jax.vmap(jax.grad(length_penalty), in_axes=(0, None, None))(_grid(), k, q)
    # C' = (1 + kx)^-q; atol: float32 rounding relative to the slope 1 at x = 0
    np.testing.assert_allclose(slope, (1 + k * _grid()) ** (-q), rtol=1e-4, atol=1e-6)
    assert np.all(slope > 0)
    # values never decrease (for q = 3 they saturate at 1 / (2k) within float32 resolution)
    assert np.all(np.diff(length_penalty(_grid(), k, q)) >= 0)


@pytest.mark.parametrize("k", [1e-4, 1e-3, 1e-2])
@pytest.mark.parametrize("q", [0.3, 1.0, 1.7, 3.0])
def test_concave_for_positive_q(k, q):
    curvature = jax.vmap(jax.grad(jax.grad(length_penalty)), in_axes=(0, None, None))(_grid(), k, q)
    want = -q * k * (1 + k * _grid()) ** (-q - 1)  # C'' = -q k (1 + kx)^(-q-1)
    np.testing.assert_allclose(curvature, want, rtol=1e-3, atol=1e-12)
    assert np.all(curvature < 0)


def test_continuous_and_smooth_at_q_equal_one():
    at_one = length_penalty(X, K, 1.0)
    assert np.all(np.isfinite(at_one))
    for dq in (1e-2, 1e-3, 1e-4, 1e-6):
        for q in (1.0 - dq, 1.0 + dq):
            gap = np.abs(length_penalty(X, K, q) - at_one)
            # |dC/dq| at q = 1 is log(1 + kx)^2 / (2k): the gap shrinks linearly in dq
            slope = np.log1p(K * np.asarray(X)) ** 2 / (2 * K)
            bound = 1.1 * dq * slope + 1e-6 * np.asarray(at_one)  # + float32 rounding
            assert np.all(gap <= bound), (q, gap, bound)
    dc_dq = jax.vmap(jax.grad(length_penalty, argnums=2), in_axes=(0, None, None))(X, K, 1.0)
    np.testing.assert_allclose(dc_dq, -(np.log1p(K * np.asarray(X)) ** 2) / (2 * K), rtol=1e-4)


def test_length_penalty_errors():
    with pytest.raises(ValueError, match=r"length_penalty k=0.0 must lie in \(0.0, inf\]"):
        length_penalty(X, 0.0, 0.5)
    with pytest.raises(ValueError, match="length_penalty x=-1.0 must lie in"):
        length_penalty(-1.0, 1e-3, 0.5)


def test_effort_weighted_sum():
    counts = {
        "thinking_tokens": jnp.array([100.0, 2000.0]),
        "tool_call_tokens": jnp.array([20.0, 300.0]),
        "tool_output_tokens": jnp.array([5000.0, 9000.0]),
        "final_message_tokens": jnp.array([50.0, 80.0]),
        "num_tool_calls": jnp.array([1.0, 12.0]),
        "num_turns": jnp.array([2.0, 13.0]),
    }
    np.testing.assert_allclose(effort(counts), [170.0, 2380.0])  # tool output free by default
    w = EffortWeights(tool_output_tokens=0.1, num_tool_calls=50.0, num_turns=10.0)
    np.testing.assert_allclose(effort(counts, w), [740.0, 4010.0])


def test_effort_errors():
    with pytest.raises(ValueError, match=r"effort counts \['tokens'\] are not among"):
        effort({"tokens": jnp.ones(2)})
    missing = r"\['tool_call_tokens', 'final_message_tokens'\] are missing"
    with pytest.raises(ValueError, match=missing):
        effort({"thinking_tokens": jnp.ones(2)})
    with pytest.raises(ValueError, match="EffortWeights.num_turns=-1.0 must lie in"):
        EffortWeights(num_turns=-1.0)
