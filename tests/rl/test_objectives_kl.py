"""KL estimators on a small categorical policy: what each gradient estimates (docs/recipe.md §2).

Monte Carlo checks use N i.i.d. samples and a tolerance of 5 standard errors per coordinate
(the standard error is measured on the same samples); exact checks enumerate the vocabulary.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2.rl.objectives import (
    aggregate_loss,
    combine_rewards,
    group_advantages,
    kl_estimate,
    kl_token_loss,
    policy_gradient_loss,
    sequence_kl,
)

V = 6
N = 120_000
GROUP = 4
BETA = 0.5
SE_TOL = 5.0

THETA = jnp.array([0.3, -1.2, 0.8, 0.0, 1.5, -0.4], jnp.float32)  # pi_theta's logits
PHI = jnp.array([-0.5, 0.4, 0.9, -1.0, 0.2, 0.7], jnp.float32)  # pi_ref's logits


def _kl(a_logits, b_logits):
    """Exact KL(softmax(a) || softmax(b))."""
    la, lb = jax.nn.log_softmax(a_logits), jax.nn.log_softmax(b_logits)
    return jnp.sum(jnp.exp(la) * (la - lb))


GRAD_FORWARD_KL = jax.grad(_kl)(THETA, PHI)  # grad of KL(pi_theta || pi_ref)
GRAD_REVERSE_KL = jax.grad(lambda t: _kl(PHI, t))(THETA)  # grad of KL(pi_ref || pi_theta)


def _samples():
    return jax.random.categorical(jax.random.key(0), THETA, shape=(N,))


def _logp(logits, x_N):
    return jax.nn.log_softmax(logits)[x_N][:, None]  # [N, 1]: each sample a one-token sequence


def _per_sample_se(coef_N, x_N, group=1):
    """Standard error of mean_i coef_i * grad log pi(x_i), the samples' gradient terms
    (summed within groups first when samples in a group are correlated through the baseline)."""
    g_NV = coef_N[:, None] * (jax.nn.one_hot(x_N, V) - jax.nn.softmax(THETA))
    g_GV = g_NV.reshape(-1, group, V).sum(1)
    return np.asarray(g_GV.std(0) / np.sqrt(g_GV.shape[0]) / group)


def test_estimator_values_and_float32():
    logp = jnp.array([-1.0, -2.0, -0.5], jnp.bfloat16)
    ref = jnp.array([-1.5, -1.0, -0.5], jnp.bfloat16)
    log_r = np.array([-0.5, 1.0, 0.0])
    r = np.exp(log_r)
    for kind, want in {
        "k1": -log_r,
        "k2": log_r**2 / 2,
        "k3": r - 1 - log_r,
    }.items():
        got = kl_estimate(logp, ref, kind)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_k3_exact_near_r_equal_one():
    """r - 1 - log r ~ (log r)^2 / 2 for tiny log r: no cancellation to 0."""
    logp = jnp.zeros(3)
    ref = jnp.array([1e-4, -1e-4, 3e-5])
    np.testing.assert_allclose(kl_estimate(logp, ref, "k3"), ref**2 / 2 + ref**3 / 6, rtol=1e-6)
    x = np.array([-0.011, -0.0099, 0.0099, 0.011])  # both sides of the series/expm1 switch
    np.testing.assert_allclose(kl_estimate(jnp.zeros(4), x, "k3"), np.expm1(x) - x, rtol=1e-4)


def test_unknown_kind_and_shape_errors():
    with pytest.raises(ValueError, match=r"kl_kind='k4' is not one of \['k1', 'k2', 'k3'\]"):
        kl_estimate(jnp.zeros(2), jnp.zeros(2), "k4")
    with pytest.raises(ValueError, match="must have one shape"):
        kl_estimate(jnp.zeros(2), jnp.zeros(3), "k1")
    with pytest.raises(AssertionError, match="ref_logp_BT must have mask_BT's shape"):
        sequence_kl(jnp.zeros((2, 3)), jnp.zeros((2, 4)), jnp.ones((2, 3)))


@pytest.mark.parametrize("baseline, scale", [("leave_one_out", 1.0), ("mean", (GROUP - 1) / GROUP)])
def test_k1_in_reward_gives_gradient_of_kl(baseline, scale):
    """The recipe's placement: -beta * k1 in the return; its policy gradient is beta * grad KL
    (the group-mean baseline, which includes the sample itself, shrinks it by (G-1)/G)."""
    x_N = _samples()
    mask = jnp.ones((N, 1))

    def surrogate(theta):
        logp = _logp(theta, x_N)
        kl_B = sequence_kl(logp, _logp(PHI, x_N), mask, "k1")
        total_B, _ = combine_rewards({"task": jnp.zeros(N), "kl": kl_B}, {"kl": BETA})
        adv_B = group_advantages(total_B, GROUP, baseline=baseline)
        token_loss, _ = policy_gradient_loss(logp, jax.lax.stop_gradient(logp), adv_B, mask)
        return aggregate_loss(token_loss, mask, "token_mean"), adv_B

    grad, adv_B = jax.grad(surrogate, has_aux=True)(THETA)
    se = _per_sample_se(-adv_B, x_N, GROUP)
    want = scale * BETA * GRAD_FORWARD_KL
    assert np.all(np.abs(grad - want) < SE_TOL * se + 1e-6), (grad, want, se)
    assert np.linalg.norm(want) > 20 * np.linalg.norm(se)  # the test can tell a wrong answer


def test_k1_in_reward_sequences_with_padding():
    """Three-token sequences of a tabular autoregressive policy: summing k1 over a sample's tokens
    (padding excluded, even when it holds NaN) gives the gradient of the sequence-level KL."""
    v, t, n = 3, 3, 60_000
    theta = jax.random.normal(jax.random.key(1), (v + 1, v))  # row v: the first token's logits
    phi = jax.random.normal(jax.random.key(2), (v + 1, v))

    def seq_logp(table, x_NT):
        prev_NT = jnp.concatenate([jnp.full((x_NT.shape[0], 1), v), x_NT[:, :-1]], axis=1)
        return jnp.take_along_axis(jax.nn.log_softmax(table)[prev_NT], x_NT[..., None], -1)[..., 0]

    def exact_kl(table):
        seqs = jnp.array(np.indices((v,) * t).reshape(t, -1).T)
        lp, lq = seq_logp(table, seqs).sum(-1), seq_logp(phi, seqs).sum(-1)
        return jnp.sum(jnp.exp(lp) * (lp - lq))

    keys = jax.random.split(jax.random.key(3), t)
    x_cols, prev = [], jnp.full((n,), v)
    for key in keys:  # ancestral sampling (test-side data generation)
        prev = jax.random.categorical(key, theta[prev])
        x_cols.append(prev)
    x_GST = jnp.stack(x_cols, 1).reshape(n // GROUP, GROUP, t)
    pad_ST = jnp.full((GROUP, 2), jnp.nan)
    mask_ST = jnp.concatenate([jnp.ones((GROUP, t)), jnp.zeros((GROUP, 2))], 1)

    def group_surrogate(table, x_ST):
        """One group's loss; the batch loss (sequence_mean_token_sum) is the mean over groups."""
        logp = jnp.concatenate([seq_logp(table, x_ST), pad_ST], 1)
        ref = jnp.concatenate([seq_logp(phi, x_ST), pad_ST], 1)
        kl_S = sequence_kl(logp, ref, mask_ST)
        adv_S = group_advantages(-BETA * kl_S, GROUP, baseline="leave_one_out")
        token_loss, _ = policy_gradient_loss(logp, jax.lax.stop_gradient(logp), adv_S, mask_ST)
        return aggregate_loss(token_loss, mask_ST, "sequence_mean_token_sum")

    grads = jax.vmap(jax.grad(group_surrogate), in_axes=(None, 0))(theta, x_GST)
    grad, se = grads.mean(0), grads.std(0) / np.sqrt(grads.shape[0])
    want = BETA * jax.grad(exact_kl)(theta)
    assert np.all(np.isfinite(grad))
    assert np.all(np.abs(grad - want) < SE_TOL * se + 1e-6), (grad, want, se)
    assert np.linalg.norm(want) > 20 * np.linalg.norm(se)


def _exact_loss_gradient(kind):
    """E_{x ~ pi_theta}[grad k(x)] exactly: the vocabulary enumerated, weights stop-gradient."""
    x_V = jnp.arange(V)
    mask = jnp.ones((V, 1))

    def expected_loss(theta):
        k_V1 = kl_token_loss(_logp(theta, x_V), _logp(PHI, x_V), mask, kind, 1.0)
        return jnp.sum(jax.lax.stop_gradient(jax.nn.softmax(theta)) * k_V1[:, 0])

    return jax.grad(expected_loss)(THETA)


def test_exact_loss_gradients_of_each_estimator():
    """As differentiable losses: k1 -> 0, k2 -> grad KL(pi||ref), k3 -> grad KL(ref||pi)."""
    chex.assert_trees_all_close(_exact_loss_gradient("k1"), jnp.zeros(V), atol=1e-6)
    chex.assert_trees_all_close(_exact_loss_gradient("k2"), GRAD_FORWARD_KL, atol=1e-6)
    chex.assert_trees_all_close(_exact_loss_gradient("k3"), GRAD_REVERSE_KL, atol=1e-6)


def _mc_loss_gradient(kind):
    x_N = _samples()
    mask = jnp.ones((N, 1))

    def loss(theta):
        k_N1 = kl_token_loss(_logp(theta, x_N), _logp(PHI, x_N), mask, kind, 1.0)
        return aggregate_loss(k_N1, mask, "token_mean")

    return jax.grad(loss)(THETA), x_N


def test_k1_as_loss_has_zero_expected_gradient():
    grad, x_N = _mc_loss_gradient("k1")
    se = _per_sample_se(jnp.ones(N), x_N)  # grad k1(x) = grad log pi(x)
    assert np.all(np.abs(grad) < SE_TOL * se), (grad, se)
    assert np.linalg.norm(GRAD_FORWARD_KL) > 20 * np.linalg.norm(se)  # zero is not "close to" it


def test_k3_as_loss_is_biased():
    """Measured bias of the k3 loss gradient against grad KL(pi||ref): it matches the exact bias
    grad KL(ref||pi) - grad KL(pi||ref) and is many standard errors from zero."""
    grad, x_N = _mc_loss_gradient("k3")
    r_N = jnp.exp(_logp(PHI, x_N) - _logp(THETA, x_N))[:, 0]
    se = _per_sample_se(1.0 - r_N, x_N)  # grad k3(x) = (1 - r) grad log pi(x)
    bias = np.asarray(grad - GRAD_FORWARD_KL)
    exact_bias = np.asarray(GRAD_REVERSE_KL - GRAD_FORWARD_KL)
    assert np.all(np.abs(bias - exact_bias) < SE_TOL * se + 1e-6), (bias, exact_bias, se)
    assert np.linalg.norm(bias) > 20 * np.linalg.norm(se), (bias, se)
    assert np.linalg.norm(bias) > 0.3 * np.linalg.norm(GRAD_FORWARD_KL)  # not a small effect
