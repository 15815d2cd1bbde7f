"""Group advantages against direct per-group formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2.rl.objectives import ADVANTAGE_ESTIMATORS, group_advantages

REWARDS = jnp.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 3.0, -1.0, 2.0, 0.0])
G = 4


def _per_group(fn):
    r = np.asarray(REWARDS).reshape(-1, G)
    return np.concatenate([fn(g) for g in r])


def test_group_mean_is_the_default_recipe():
    np.testing.assert_allclose(group_advantages(REWARDS, G), _per_group(lambda g: g - g.mean()))
    np.testing.assert_allclose(
        ADVANTAGE_ESTIMATORS.get("group_mean")(REWARDS, G), group_advantages(REWARDS, G)
    )


def test_std_normalisation_matches_grpo():
    want = _per_group(lambda g: (g - g.mean()) / (g.std(ddof=1) + 1e-6))
    np.testing.assert_allclose(group_advantages(REWARDS, G, normalize_std=True), want, rtol=1e-5)
    # a group with equal rewards has zero advantage, not 0/0
    assert np.all(group_advantages(REWARDS, G, normalize_std=True)[4:8] == 0.0)


def test_leave_one_out():
    want = _per_group(lambda g: g - (g.sum() - g) / (G - 1))
    got = ADVANTAGE_ESTIMATORS.get("leave_one_out")(REWARDS, G)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # RLOO is the group-mean advantage scaled by G / (G - 1)
    np.testing.assert_allclose(got, group_advantages(REWARDS, G) * G / (G - 1), rtol=1e-6)


def test_invalid_samples_are_left_out():
    valid = jnp.array([1, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0], bool)
    rewards = REWARDS.at[3].set(jnp.nan)  # a failed rollout's garbage reward
    got = group_advantages(rewards, G, valid_B=valid)
    np.testing.assert_allclose(got[:3], [2 / 3, -1 / 3, -1 / 3], rtol=1e-6)
    assert got[3] == 0.0
    np.testing.assert_allclose(got[8:], 0.0)  # a single valid sample has no baseline
    got_loo = group_advantages(rewards, G, valid_B=valid, baseline="leave_one_out")
    np.testing.assert_allclose(got_loo[:3], [1.0, -0.5, -0.5], rtol=1e-6)


def test_jit_and_dtype():
    got = jax.jit(group_advantages, static_argnums=(1, 2))(REWARDS.astype(jnp.bfloat16), G, True)
    assert got.dtype == jnp.float32


def test_errors():
    with pytest.raises(ValueError, match="12 samples, not a multiple of group_size=5"):
        group_advantages(REWARDS, 5)
    with pytest.raises(ValueError, match="group_size=0 must be a positive int"):
        group_advantages(REWARDS, 0)
    with pytest.raises(ValueError, match="baseline='median' is not one of"):
        group_advantages(REWARDS, G, baseline="median")
    with pytest.raises(ValueError, match="advantage='ppo' is not one of"):
        ADVANTAGE_ESTIMATORS.get("ppo")
    with pytest.raises(AssertionError, match="rewards_B must be \\[batch\\]"):
        group_advantages(REWARDS.reshape(3, 4), G)
