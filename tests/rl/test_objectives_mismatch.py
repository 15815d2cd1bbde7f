"""Train-inference mismatch filter: thresholds, the per-batch quantile, statistics, padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2.rl.objectives import ObjectiveConfig, mismatch_filter, objective_mismatch_filter, rl_loss

B, T = 100, 120  # 12000 slots


def _batch(key=0):
    k1, k2, k3 = jax.random.split(jax.random.key(key), 3)
    lengths = jax.random.randint(k1, (B,), 1, T + 1).at[:5].set(T)
    mask_BT = jnp.arange(T)[None, :] < lengths[:, None]
    train_BT = -jax.random.exponential(k2, (B, T))
    # heavy-tailed mismatch, as when a few tokens route differently; garbage in the padding
    infer_BT = train_BT + 0.05 * jax.random.t(k3, 2.0, (B, T))
    return train_BT, jnp.where(mask_BT, infer_BT, jnp.nan), mask_BT


def test_quantile_rule_drops_the_expected_fraction():
    train, infer, mask = _batch()
    n = int(mask.sum())
    jit_filter = jax.jit(mismatch_filter, static_argnames="level")  # q traced: one compile
    for q in (0.99, 0.9, 0.5):
        keep, stats = jit_filter(train, infer, mask, quantile=q)
        # linear-interpolated quantile: exactly the values above sorted index floor(q (n-1)) go
        want_dropped = n - 1 - int(np.floor(q * (n - 1)))
        assert int(mask.sum() - keep.sum()) == want_dropped
        assert stats["frac_tokens_dropped"] == pytest.approx(want_dropped / n)
        assert not np.any(keep & ~mask)


def test_statistics_against_numpy():
    train, infer, mask = _batch()
    _, stats = mismatch_filter(train, infer, mask)
    d = np.abs(np.asarray(train) - np.asarray(infer))[np.asarray(mask)]
    assert stats["mismatch_mean"] == pytest.approx(d.mean(), rel=1e-5)
    assert stats["mismatch_p50"] == pytest.approx(np.quantile(d, 0.5), rel=1e-5)
    assert stats["mismatch_p99"] == pytest.approx(np.quantile(d, 0.99), rel=1e-5)
    assert stats["mismatch_max"] == pytest.approx(d.max(), rel=1e-6)
    assert stats["frac_tokens_dropped"] == 0.0  # neither threshold nor quantile: measure only


def test_fixed_threshold_token_and_sample_level():
    train, infer, mask = _batch()
    d = np.where(mask, np.abs(np.asarray(train) - np.asarray(infer)), 0.0)
    keep, _ = mismatch_filter(train, infer, mask, threshold=0.2)
    np.testing.assert_array_equal(keep, np.asarray(mask) & (d <= 0.2))
    keep_s, stats = mismatch_filter(train, infer, mask, level="sample", threshold=0.2)
    bad = d.max(-1) > 0.2
    np.testing.assert_array_equal(keep_s, np.asarray(mask) & ~bad[:, None])
    assert stats["frac_samples_with_drops"] == pytest.approx(bad.mean())


def test_sample_level_quantile():
    train, infer, mask = _batch()
    keep, stats = mismatch_filter(train, infer, mask, level="sample", quantile=0.9)
    dropped_samples = np.asarray(mask.any(-1) & ~keep.any(-1))
    assert dropped_samples.sum() == B - 1 - int(np.floor(0.9 * (B - 1)))  # 10 of 100
    # whole samples go: a kept sample keeps all its tokens
    kept_rows = keep.any(-1)
    np.testing.assert_array_equal(keep[kept_rows], mask[kept_rows])


def test_masked_tokens_contribute_nothing_to_the_loss():
    """Tokens the filter drops carry no loss and no gradient, whatever their logprobs."""
    train, infer, mask = _batch()
    cfg = ObjectiveConfig(group_size=4, loss_constant=float(4 * T), importance_correction="none")
    keep, _ = objective_mismatch_filter(cfg, train, infer, mask)
    assert int(mask.sum() - keep.sum()) > 0
    adv = jax.random.normal(jax.random.key(5), (B,))
    behaviour = jnp.where(mask, infer, 0.0)

    def loss(logp):
        return rl_loss(cfg, logp, behaviour, adv, keep)[0]

    value, grad = jax.value_and_grad(loss)(train)
    assert np.all(grad[~keep] == 0.0)
    wild = jnp.where(keep, train, 1e4 * jax.random.normal(jax.random.key(6), (B, T)))
    assert loss(wild) == pytest.approx(float(value), rel=1e-6)


def test_threshold_and_quantile_together_drop_above_either():
    """Both limits: a token goes when it is above the threshold or above the quantile, so the
    limit applied is the smaller (a high threshold leaves the quantile's drops; a low one adds)."""
    train, infer, mask = _batch()
    d = np.where(mask, np.abs(np.asarray(train) - np.asarray(infer)), 0.0)
    p99 = np.quantile(d[np.asarray(mask)], 0.99)
    for threshold in (10 * p99, p99 / 2):
        keep, stats = mismatch_filter(train, infer, mask, threshold=threshold, quantile=0.99)
        want = np.asarray(mask) & (d <= min(threshold, p99))
        np.testing.assert_array_equal(keep, want)
        assert float(stats["mismatch_threshold"]) == pytest.approx(min(threshold, p99), rel=1e-5)


def test_errors():
    train, infer, mask = _batch()
    with pytest.raises(ValueError, match=r"mismatch_threshold=-0.1 must lie in \[0.0, inf\]"):
        mismatch_filter(train, infer, mask, threshold=-0.1, quantile=0.99)
    with pytest.raises(ValueError, match=r"mismatch_quantile=1.5 must lie in \(0.0, 1.0\]"):
        mismatch_filter(train, infer, mask, quantile=1.5)
    with pytest.raises(ValueError, match="mismatch_level='batch' is not one of"):
        mismatch_filter(train, infer, mask, level="batch")
