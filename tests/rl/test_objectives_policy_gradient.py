"""Policy-gradient token loss: importance corrections (TIS, MIS), PPO clipping, padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2.rl.objectives import importance_weights, policy_gradient_loss

MASK = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
LOGP = jnp.log(jnp.array([[0.5, 0.2, 0.1, 0.3], [0.4, 0.6, 0.3, 0.3]]))
# behaviour log mu = log pi - log(pi / mu); pi / mu per token below
RATIO = np.array([[1.0, 3.0, 0.4, 1.0], [1.5, 0.25, 1.0, 1.0]])
BEHAVIOUR = LOGP - jnp.log(jnp.asarray(RATIO))
ADV = jnp.array([2.0, -1.0])


def _grad_wrt_logp(**kw):
    """d (sum of token losses) / d logp: the per-token policy-gradient coefficient."""

    def total(logp):
        return policy_gradient_loss(logp, BEHAVIOUR, ADV, MASK, **kw)[0].sum()

    return jax.grad(total)(LOGP)


def test_on_policy_gradient_is_minus_advantage():
    g = _grad_wrt_logp(correction="none")
    np.testing.assert_allclose(g, -ADV[:, None] * MASK, rtol=1e-6)


def test_tis_truncates_at_cap():
    g = _grad_wrt_logp(correction="tis", tis_cap=2.0)
    want = -ADV[:, None] * np.minimum(RATIO, 2.0) * MASK
    np.testing.assert_allclose(g, want, rtol=1e-5)
    _, metrics = policy_gradient_loss(LOGP, BEHAVIOUR, ADV, MASK, correction="tis", tis_cap=2.0)
    assert metrics["frac_truncated"] == pytest.approx(1 / 5)  # one of five valid tokens above 2
    assert metrics["is_ratio_max"] == pytest.approx(3.0, rel=1e-5)


def test_mis_drops_tokens_outside_interval():
    g = _grad_wrt_logp(correction="mis", mis_low=0.5, mis_high=2.0)
    keep = (RATIO >= 0.5) & (RATIO <= 2.0) & (np.asarray(MASK) > 0)
    np.testing.assert_allclose(g, np.where(keep, -ADV[:, None] * RATIO, 0.0), rtol=1e-5)
    _, metrics = policy_gradient_loss(LOGP, BEHAVIOUR, ADV, MASK, correction="mis")
    assert metrics["frac_masked_is"] == pytest.approx(3 / 5)


def test_sequence_level_ratio_is_product_over_valid_tokens():
    weight, keep, ratio = importance_weights(LOGP, BEHAVIOUR, MASK, "none", level="sequence")
    seq_ratio = np.prod(np.where(np.asarray(MASK) > 0, RATIO, 1.0), axis=1)
    np.testing.assert_allclose(ratio, np.broadcast_to(seq_ratio[:, None], MASK.shape), rtol=1e-5)
    np.testing.assert_allclose(weight, MASK)
    w_tis, _, _ = importance_weights(LOGP, BEHAVIOUR, MASK, "tis", level="sequence", cap=0.5)
    np.testing.assert_allclose(w_tis, np.minimum(seq_ratio, 0.5)[:, None] * MASK, rtol=1e-5)
    _, keep_mis, _ = importance_weights(LOGP, BEHAVIOUR, MASK, "mis", level="sequence")
    in_interval = (seq_ratio >= 0.5) & (seq_ratio <= 2.0)  # 1.2 kept, 0.375 dropped
    np.testing.assert_array_equal(keep_mis, in_interval[:, None] & (np.asarray(MASK) > 0))


def test_ppo_clipping_stops_gradient_outside_trust_region():
    """old = logp - log(1.5): ratio 1.5 > 1 + 0.2. A > 0: clipped, no gradient. A < 0: the
    unclipped (pessimistic) term is kept, so the gradient is -A * ratio."""
    old = LOGP - jnp.log(1.5)
    adv = jnp.array([1.0, -1.0])

    def total(logp):
        return policy_gradient_loss(
            logp, old, adv, MASK, old_logp_BT=old, correction="none", clip_low=0.2, clip_high=0.2
        )[0].sum()

    g = jax.grad(total)(LOGP)
    np.testing.assert_allclose(g[0], 0.0)
    np.testing.assert_allclose(g[1], 1.5 * MASK[1], rtol=1e-5)
    _, metrics = policy_gradient_loss(
        LOGP, old, adv, MASK, old_logp_BT=old, correction="none", clip_low=0.2, clip_high=0.2
    )
    assert metrics["frac_clipped"] == pytest.approx(3 / 5)


def test_token_advantages_and_loss_value():
    adv_BT = jnp.arange(8.0).reshape(2, 4)
    loss_BT, _ = policy_gradient_loss(LOGP, LOGP, adv_BT, MASK)
    np.testing.assert_allclose(loss_BT, -adv_BT * MASK)  # on-policy: ratio 1, weight 1


def test_padding_with_nan_contributes_nothing():
    logp = jnp.where(MASK > 0, LOGP, jnp.nan)
    behaviour = jnp.where(MASK > 0, BEHAVIOUR, jnp.inf)

    def total(lp):
        return policy_gradient_loss(lp, behaviour, ADV, MASK, correction="tis")[0].sum()

    value, g = jax.value_and_grad(total)(logp)
    want = -(ADV[:, None] * np.minimum(RATIO, 2.0) * MASK).sum()
    np.testing.assert_allclose(value, want, rtol=1e-5)
    assert np.all(g[MASK == 0] == 0.0) and np.all(np.isfinite(g))


def test_bf16_inputs_compute_in_float32():
    loss_BT, metrics = policy_gradient_loss(
        LOGP.astype(jnp.bfloat16), BEHAVIOUR.astype(jnp.bfloat16), ADV, MASK
    )
    assert loss_BT.dtype == jnp.float32
    assert all(v.dtype == jnp.float32 for v in metrics.values())


def test_errors():
    with pytest.raises(ValueError, match="importance_correction='is' is not one of"):
        policy_gradient_loss(LOGP, BEHAVIOUR, ADV, MASK, correction="is")
    with pytest.raises(ValueError, match="importance_level='batch' is not one of"):
        policy_gradient_loss(LOGP, BEHAVIOUR, ADV, MASK, level="batch")
    with pytest.raises(ValueError, match=r"tis_cap=0.0 must lie in \(0.0, inf\]"):
        policy_gradient_loss(LOGP, BEHAVIOUR, ADV, MASK, tis_cap=0.0)
    with pytest.raises(AssertionError, match="advantages must be \\[B\\]"):
        policy_gradient_loss(LOGP, BEHAVIOUR, jnp.ones(3), MASK)
    with pytest.raises(AssertionError, match="behaviour_logp_BT must have mask_BT's shape"):
        policy_gradient_loss(LOGP, BEHAVIOUR[:, :3], ADV, MASK)
    with pytest.raises(ValueError, match=r"clip_low=1.5 must lie in \[0.0, 1.0\]"):
        policy_gradient_loss(LOGP, BEHAVIOUR, ADV, MASK, clip_low=1.5)
