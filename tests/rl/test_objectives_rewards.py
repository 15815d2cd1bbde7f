"""Reward combination: signs, weights, schedules over steps, logging."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from c2.rl.objectives import combine_rewards, length_penalty

TERMS = {
    "task": jnp.array([1.0, 0.0, 1.0]),
    "style": jnp.array([0.5, 0.2, 0.0]),
    "communication": jnp.array([1.0, 0.0, 0.5]),
    "tool_call_penalty": jnp.array([0.0, 2.0, 1.0]),
    "length_penalty": length_penalty(jnp.array([100.0, 5000.0, 800.0]), 1e-3, 0.5),
    "kl": jnp.array([3.0, 1.0, 0.0]),
}


def test_total_and_terms():
    weights = {
        "style": 0.1,
        "communication": 0.2,
        "tool_call_penalty": 0.05,
        "length_penalty": 1e-4,
        "kl": 0.01,
    }
    total, log = combine_rewards(TERMS, weights)
    t = {k: np.asarray(v) for k, v in TERMS.items()}
    want = (
        t["task"]
        + 0.1 * t["style"]
        + 0.2 * t["communication"]
        - 0.05 * t["tool_call_penalty"]
        - 1e-4 * t["length_penalty"]
        - 0.01 * t["kl"]
    )
    np.testing.assert_allclose(total, want, rtol=1e-6)
    np.testing.assert_allclose(log["reward/total"], want, rtol=1e-6)
    np.testing.assert_allclose(log["reward/kl"], -0.01 * t["kl"], rtol=1e-6)
    np.testing.assert_allclose(sum(log[f"reward/{k}"] for k in TERMS), want, rtol=1e-6)
    assert log["weight/task"] == 1.0 and log["weight/style"] == pytest.approx(0.1)


def test_weights_follow_a_schedule_under_jit():
    """A behaviour reward switched on after step 100, ramped over 100 steps."""
    style_schedule = optax.schedules.join_schedules(
        [optax.schedules.constant_schedule(0.0), optax.schedules.linear_schedule(0.0, 0.2, 100)],
        boundaries=[100],
    )
    terms = {"task": TERMS["task"], "style": TERMS["style"]}

    @jax.jit
    def total_at(step):
        return combine_rewards(terms, {"style": style_schedule}, step)

    for step, w in [(0, 0.0), (100, 0.0), (150, 0.1), (200, 0.2), (500, 0.2)]:
        total, log = total_at(jnp.asarray(step))
        assert log["weight/style"] == pytest.approx(w, abs=1e-7)
        np.testing.assert_allclose(total, TERMS["task"] + w * TERMS["style"], rtol=1e-6)


def test_errors():
    with pytest.raises(ValueError, match=r"reward terms \['speed'\] are not among"):
        combine_rewards({"task": jnp.ones(2), "speed": jnp.ones(2)}, {"speed": 1.0})
    with pytest.raises(ValueError, match="must include 'task'"):
        combine_rewards({"style": jnp.ones(2)}, {"style": 1.0})
    with pytest.raises(ValueError, match=r"reward terms \['kl'\] have no weight"):
        combine_rewards({"task": jnp.ones(2), "kl": jnp.ones(2)}, {})
    with pytest.raises(ValueError, match=r"reward weights \['style'\] have no term"):
        combine_rewards({"task": jnp.ones(2)}, {"style": 0.1})
    with pytest.raises(AssertionError, match="reward terms must share"):
        combine_rewards({"task": jnp.ones(2), "kl": jnp.ones(3)}, {"kl": 0.1})
