"""The composed objective: config validation, the recipe defaults, jit, KL placement."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2.rl.objectives import ObjectiveConfig, objective_advantages, rl_loss

B, T = 8, 5
KEYS = jax.random.split(jax.random.key(0), 4)
LOGP = -jax.random.exponential(KEYS[0], (B, T))
BEHAVIOUR = LOGP + 0.2 * jax.random.normal(KEYS[1], (B, T))
REF = LOGP + 0.5 * jax.random.normal(KEYS[2], (B, T))
MASK = jnp.arange(T)[None, :] < jnp.array([5, 3, 1, 4, 5, 2, 2, 5])[:, None]
REWARDS = jax.random.bernoulli(KEYS[3], 0.5, (B,)).astype(jnp.float32)


def test_defaults_are_the_recipe():
    cfg = ObjectiveConfig(group_size=4, loss_constant=20.0)
    assert (cfg.advantage, cfg.kl_kind, cfg.kl_placement, cfg.aggregation) == (
        "group_mean",
        "k1",
        "reward",
        "sum_constant",
    )
    assert cfg.mismatch_quantile == 0.99 and cfg.mismatch_threshold == 3.0
    hash(cfg)  # static under jit


def test_rl_loss_is_pg_aggregated_by_constant():
    """The defaults by hand in float64: A = r - group mean, TIS weight min(pi/mu, 2) on each
    token, loss = -sum(mask * w * A) / C, and d loss / d logp = -mask * w * A / C."""
    cfg = ObjectiveConfig(group_size=4, loss_constant=20.0)
    adv = objective_advantages(cfg, REWARDS)
    r = np.asarray(REWARDS, np.float64).reshape(2, 4)
    adv_np = (r - r.mean(1, keepdims=True)).reshape(-1)
    np.testing.assert_allclose(adv, adv_np, atol=1e-7)
    behaviour = BEHAVIOUR.at[:, 0].add(-1.0)  # first tokens: pi/mu > 2, truncated by TIS
    logp, mu = np.asarray(LOGP, np.float64), np.asarray(behaviour, np.float64)
    m = np.asarray(MASK, np.float64)
    w = np.minimum(np.exp(logp - mu), 2.0)
    assert (w == 2.0).any() and (w < 2.0).any()  # the cap is exercised both ways
    want = -(m * w * adv_np[:, None]).sum() / 20.0
    loss_fn = jax.jit(rl_loss, static_argnums=0)
    loss, metrics = loss_fn(cfg, LOGP, behaviour, adv, MASK)
    assert float(loss) == pytest.approx(want, rel=1e-5)
    grad = jax.grad(lambda lp: loss_fn(cfg, lp, behaviour, adv, MASK)[0])(LOGP)
    np.testing.assert_allclose(grad, -m * w * adv_np[:, None] / 20.0, rtol=1e-5, atol=1e-8)
    assert "kl_loss" not in metrics  # the KL lives in the reward by default
    assert loss.dtype == jnp.float32


def test_kl_in_the_loss_adds_beta_k():
    """kl_placement="loss" by hand in float64: with token_mean, the loss is the policy-gradient
    term plus beta * mean over valid tokens of k3 = r - 1 - log r (log r = ref - logp), and the KL
    term's gradient in logp is beta * (1 - r) / n_tokens on valid tokens."""
    cfg = ObjectiveConfig(
        group_size=4, aggregation="token_mean", kl_placement="loss", kl_kind="k3", kl_beta=0.1
    )
    adv = objective_advantages(cfg, REWARDS)
    logp, ref, mu = (np.asarray(x, np.float64) for x in (LOGP, REF, BEHAVIOUR))
    m = np.asarray(MASK, np.float64)
    n = m.sum()
    r = np.asarray(REWARDS, np.float64).reshape(2, 4)
    a = (r - r.mean(1, keepdims=True)).reshape(-1, 1)
    log_r = ref - logp
    kl_want = 0.1 * (m * (np.exp(log_r) - 1.0 - log_r)).sum() / n
    pg_want = -(m * np.minimum(np.exp(logp - mu), 2.0) * a).sum() / n
    loss, metrics = rl_loss(cfg, LOGP, BEHAVIOUR, adv, MASK, ref_logp_BT=REF)
    assert float(metrics["kl_loss"]) == pytest.approx(kl_want, rel=1e-5)
    assert float(metrics["pg_loss"]) == pytest.approx(pg_want, rel=1e-5)
    assert float(loss) == pytest.approx(pg_want + kl_want, rel=1e-5)
    grad = jax.grad(lambda lp: rl_loss(cfg, lp, BEHAVIOUR, adv, MASK, ref_logp_BT=REF)[0])(LOGP)
    pg_grad = -m * np.minimum(np.exp(logp - mu), 2.0) * a / n
    kl_grad = 0.1 * m * (1.0 - np.exp(log_r)) / n
    np.testing.assert_allclose(grad, pg_grad + kl_grad, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="kl_placement='loss' needs ref_logp_BT"):
        rl_loss(cfg, LOGP, BEHAVIOUR, adv, MASK)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(advantage="grpo"), "advantage='grpo' is not one of"),
        (dict(kl_kind="k4"), "kl_kind='k4' is not one of"),
        (dict(kl_placement="both"), "kl_placement='both' is not one of"),
        (dict(kl_beta=-1.0), "kl_beta=-1.0 must lie in"),
        (dict(aggregation="mean"), "aggregation='mean' is not one of"),
        (dict(loss_constant=None), "needs loss_constant"),
        (dict(loss_constant=-2.0), "loss_constant=-2.0 must lie in"),
        (dict(importance_correction="vtrace"), "importance_correction='vtrace' is not one of"),
        (dict(mis_low=2.0, mis_high=1.0), r"mis_high=1.0 must lie in \[2.0, inf\]"),
        (dict(clip_low=1.2), "clip_low=1.2 must lie in"),
        (dict(mismatch_threshold=-0.5), "mismatch_threshold=-0.5 must lie in"),
        (dict(mismatch_quantile=0.0), "mismatch_quantile=0.0 must lie in"),
        (dict(group_size=2.0), "group_size=2.0 must be an int"),
    ],
)
def test_config_errors_name_field_and_value(change, message):
    base = dict(group_size=4, loss_constant=20.0)
    with pytest.raises(ValueError, match=message):
        ObjectiveConfig(**{**base, **change})


def test_every_combination_is_finite_and_differentiable():
    """Every registered choice composes; the gradient is finite and zero on padding."""
    base = ObjectiveConfig(group_size=4, loss_constant=20.0, kl_placement="loss")
    for change in [
        dict(advantage="group_mean_std"),
        dict(advantage="leave_one_out", aggregation="sequence_mean_token_mean"),
        dict(importance_correction="mis", importance_level="sequence"),
        dict(importance_correction="none", clip_low=0.2, clip_high=0.28),
        dict(kl_kind="k2", aggregation="sequence_mean_token_sum"),
    ]:
        cfg = dataclasses.replace(base, **change)
        adv = objective_advantages(cfg, REWARDS)
        grad = jax.grad(
            lambda lp, cfg=cfg, adv=adv: rl_loss(cfg, lp, BEHAVIOUR, adv, MASK, ref_logp_BT=REF)[0]
        )(LOGP)
        assert np.all(np.isfinite(grad)) and np.all(grad[~MASK] == 0.0), change
