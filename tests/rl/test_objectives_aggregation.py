"""Loss aggregation: length bias of each mode, and micro-batch / device split invariance."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from c2.rl.objectives import (
    AGGREGATIONS,
    ObjectiveConfig,
    aggregate_loss,
    loss_normalizers,
    rl_loss,
    token_weights,
)

MODES = AGGREGATIONS.names()
B, T, V = 16, 6, 5


def _two_lengths():
    """Two samples, lengths 2 and 5, padded to T = 6."""
    lengths = jnp.array([2, 5])
    return (jnp.arange(T)[None, :] < lengths[:, None]).astype(jnp.float32), lengths


def _token_gradient_weights(mode, mask_BT, **kw):
    """d loss / d token_loss: the weight a token's gradient gets."""
    loss_BT = jnp.ones_like(mask_BT)
    return jax.grad(lambda l: aggregate_loss(l, mask_BT, mode, **kw))(loss_BT)


def test_sum_constant_weight_does_not_depend_on_length():
    mask_BT, _ = _two_lengths()
    w_BT = _token_gradient_weights("sum_constant", mask_BT, constant=12.0)
    np.testing.assert_allclose(w_BT, mask_BT / 12.0)  # 1/12 for every token, short or long
    w_short = w_BT[0][mask_BT[0] > 0]
    w_long = w_BT[1][mask_BT[1] > 0]
    assert np.unique(np.concatenate([w_short, w_long])).size == 1


def test_sequence_mean_token_mean_weight_depends_on_length():
    mask_BT, lengths = _two_lengths()
    w_BT = _token_gradient_weights("sequence_mean_token_mean", mask_BT)
    np.testing.assert_allclose(w_BT, mask_BT / (2.0 * lengths[:, None]), rtol=1e-6)
    assert w_BT[0, 0] / w_BT[1, 0] == pytest.approx(5 / 2)  # a short sample's token weighs 2.5x


def test_other_modes_token_weights():
    mask_BT, _ = _two_lengths()
    np.testing.assert_allclose(_token_gradient_weights("token_mean", mask_BT), mask_BT / 7.0)
    np.testing.assert_allclose(
        _token_gradient_weights("sequence_mean_token_sum", mask_BT), mask_BT / 2.0
    )


def test_padding_contributes_nothing_even_nan():
    mask_BT, _ = _two_lengths()
    loss_BT = jnp.where(mask_BT > 0, 1.0, jnp.nan)
    for mode in MODES:
        value, grad = jax.value_and_grad(
            lambda l, mode=mode: aggregate_loss(l, mask_BT, mode, constant=4.0)
        )(loss_BT)
        assert np.isfinite(value)
        assert np.all(grad[mask_BT == 0] == 0.0)


def test_errors_name_the_field():
    mask_BT, _ = _two_lengths()
    with pytest.raises(ValueError, match="aggregation='seq_mean' is not one of"):
        aggregate_loss(mask_BT, mask_BT, "seq_mean")
    with pytest.raises(ValueError, match="needs loss_constant"):
        aggregate_loss(mask_BT, mask_BT, "sum_constant")
    with pytest.raises(ValueError, match=r"loss_constant=0.0 must lie in \(0.0, inf\]"):
        aggregate_loss(mask_BT, mask_BT, "sum_constant", constant=0.0)
    with pytest.raises(AssertionError, match="token_loss_BT must have mask_BT's shape"):
        aggregate_loss(jnp.ones((2, 5)), mask_BT, "token_mean")


def _batch():
    """A policy (logits over V tokens) and a batch with ragged lengths, one empty row."""
    k = jax.random.split(jax.random.key(0), 5)
    theta_V = jax.random.normal(k[0], (V,))
    x_BT = jax.random.randint(k[1], (B, T), 0, V)
    lengths = jax.random.randint(k[2], (B,), 1, T + 1).at[3].set(0)
    mask_BT = (jnp.arange(T)[None, :] < lengths[:, None]).astype(jnp.float32)
    behaviour_BT = jax.nn.log_softmax(theta_V)[x_BT] + 0.3 * jax.random.normal(k[3], (B, T))
    adv_B = jax.random.normal(k[4], (B,))
    ref_BT = jax.nn.log_softmax(0.5 * theta_V)[x_BT]
    return theta_V, x_BT, mask_BT, behaviour_BT, adv_B, ref_BT


def _cfg(mode):
    return ObjectiveConfig(
        group_size=4, loss_constant=float(4 * T), aggregation=mode, kl_placement="loss"
    )


def _loss(theta_V, x_BT, mask_BT, behaviour_BT, adv_B, ref_BT, cfg, **counts):
    logp_BT = jax.nn.log_softmax(theta_V)[x_BT]
    return rl_loss(cfg, logp_BT, behaviour_BT, adv_B, mask_BT, ref_logp_BT=ref_BT, **counts)[0]


@pytest.mark.parametrize("mode", MODES)
def test_micro_batch_split_invariance(mode):
    theta_V, x_BT, mask_BT, behaviour_BT, adv_B, ref_BT = _batch()
    cfg = _cfg(mode)
    whole, whole_grad = jax.value_and_grad(_loss)(
        theta_V, x_BT, mask_BT, behaviour_BT, adv_B, ref_BT, cfg
    )
    counts = loss_normalizers(mask_BT)  # the whole step's counts, given to every micro-batch
    per_sample = (x_BT, mask_BT, behaviour_BT, adv_B, ref_BT)
    loss_grad = jax.jit(jax.value_and_grad(_loss), static_argnums=6)
    for num_micro in (2, 4, 16):
        parts = [
            loss_grad(theta_V, *(a[i::num_micro] for a in per_sample), cfg, **counts)
            for i in range(num_micro)
        ]
        np.testing.assert_allclose(sum(v for v, _ in parts), whole, rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(sum(g for _, g in parts), whole_grad, rtol=2e-5, atol=1e-7)
    assert np.abs(whole_grad).max() > 1e-3  # the gradient is not trivially zero


@pytest.mark.parametrize("mode", MODES)
def test_device_split_invariance(mode):
    """Batch sharded over 8 devices with shard_map: counts psum'd, partial losses psum'd."""
    chex.assert_equal(jax.device_count(), 8)
    mesh = jax.make_mesh((8,), ("data",))
    theta_V, x_BT, mask_BT, behaviour_BT, adv_B, ref_BT = _batch()
    cfg = _cfg(mode)

    def sharded_loss(theta_V, x_BT, mask_BT, behaviour_BT, adv_B, ref_BT):
        counts = loss_normalizers(mask_BT, axis_name="data")
        local = _loss(theta_V, x_BT, mask_BT, behaviour_BT, adv_B, ref_BT, cfg, **counts)
        return jax.lax.psum(local, "data")

    sharded = jax.shard_map(
        sharded_loss, mesh=mesh, in_specs=(P(),) + (P("data"),) * 5, out_specs=P()
    )
    args = (theta_V, x_BT, mask_BT, behaviour_BT, adv_B, ref_BT)
    placed = [jax.device_put(theta_V, NamedSharding(mesh, P()))] + [
        jax.device_put(a, NamedSharding(mesh, P("data"))) for a in args[1:]
    ]
    got, got_grad = jax.jit(jax.value_and_grad(sharded))(*placed)
    want, want_grad = jax.value_and_grad(_loss)(*args, cfg)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(got_grad, want_grad, rtol=2e-5, atol=1e-7)


def test_token_mean_without_global_counts_is_not_invariant():
    """Why the counts must be passed: per-micro-batch normalisation changes the loss."""
    theta_V, x_BT, mask_BT, behaviour_BT, adv_B, ref_BT = _batch()
    cfg = _cfg("token_mean")
    whole = _loss(theta_V, x_BT, mask_BT, behaviour_BT, adv_B, ref_BT, cfg)
    halves = [
        _loss(theta_V, *(a[i::2] for a in (x_BT, mask_BT, behaviour_BT, adv_B, ref_BT)), cfg) / 2
        for i in range(2)
    ]
    assert abs(sum(halves) - whole) > 1e-4 * abs(whole)


def test_token_weights_and_aggregate_match_hand_formulas():
    """Lengths 2 and 5, losses 0..5 and 6..11: valid sums 1 and 40 over 7 tokens, 2 sequences."""
    mask_BT, _ = _two_lengths()
    loss_BT = jnp.arange(2 * T, dtype=jnp.float32).reshape(2, T)
    m = np.asarray(mask_BT, np.float64)
    lengths = m.sum(1, keepdims=True)  # [[2], [5]]
    expected = {  # mode: (weights [2, T], loss), by hand
        "sum_constant": (m / 3.0, (1 + 40) / 3.0),
        "token_mean": (m / 7.0, (1 + 40) / 7.0),
        "sequence_mean_token_mean": (m / (lengths * 2), (1 / 2 + 40 / 5) / 2),
        "sequence_mean_token_sum": (m / 2.0, (1 + 40) / 2),
    }
    assert set(MODES) == set(expected)  # a new mode needs its formula here
    for mode, (w_want, loss_want) in expected.items():
        np.testing.assert_allclose(token_weights(mask_BT, mode, constant=3.0), w_want, rtol=1e-6)
        got = aggregate_loss(loss_BT, mask_BT, mode, constant=3.0)
        assert float(got) == pytest.approx(loss_want, rel=1e-6), mode
