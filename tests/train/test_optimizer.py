"""Learning-rate schedules against their formulas; frozen parameters; decay mask; clipping."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2.train.config import stage_defaults
from c2.train.optimizer import make_optimizer, make_schedule, param_labels


def _opt(**kw):
    opt = stage_defaults().optimizer
    for k, v in kw.items():
        opt[k] = v
    return opt


def test_warmup_then_cosine():
    opt = _opt(lr=1.0, warmup_steps=10, schedule="cosine", end_lr_ratio=0.1)
    sched = make_schedule(opt, steps=110)
    np.testing.assert_allclose(sched(0), 0.0)
    np.testing.assert_allclose(sched(5), 0.5, rtol=1e-6)
    np.testing.assert_allclose(sched(10), 1.0, rtol=1e-6)
    for t in (30, 60, 110):
        want = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (t - 10) / 100))
        np.testing.assert_allclose(sched(t), want, rtol=1e-5)


def test_linear_and_constant():
    lin = make_schedule(_opt(lr=2.0, warmup_steps=4, schedule="linear", end_lr_ratio=0.0), 24)
    np.testing.assert_allclose([lin(4), lin(14), lin(24)], [2.0, 1.0, 0.0], atol=1e-6)
    const = make_schedule(_opt(lr=2.0, warmup_steps=4, schedule="constant"), 24)
    np.testing.assert_allclose([const(2), const(4), const(24)], [1.0, 2.0, 2.0], atol=1e-6)


def test_warmup_stable_decay():
    opt = _opt(lr=1.0, warmup_steps=10, schedule="wsd", decay_fraction=0.25, end_lr_ratio=0.0)
    sched = make_schedule(opt, steps=110)  # 100 steps after warmup: 75 flat, 25 decaying
    np.testing.assert_allclose([sched(10), sched(85)], [1.0, 1.0], atol=1e-6)
    np.testing.assert_allclose([sched(97.5), sched(110)], [0.5, 0.0], atol=1e-6)


def _params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {
        "w": jax.random.normal(k1, (4, 3)),
        "norm": {"scale": jnp.ones(3)},
        "moe": {"router_bias": jax.random.normal(k2, (5,))},
    }


def test_frozen_parameters_never_move_and_vectors_are_not_decayed():
    params = _params()
    labels = param_labels(params, "router_bias")
    assert labels["moe"]["router_bias"] == "frozen" and labels["w"] == "train"
    opt = _opt(lr=0.1, warmup_steps=0, schedule="constant", weight_decay=0.5, clip_norm=0.0)
    tx, _ = make_optimizer(opt, 10, params)
    state = tx.init(params)
    grads = jax.tree.map(jnp.zeros_like, params)  # only weight decay acts
    updates, state = tx.update(grads, state, params)
    chex.assert_trees_all_equal(updates["moe"]["router_bias"], jnp.zeros(5))
    chex.assert_trees_all_equal(updates["norm"]["scale"], jnp.zeros(3))
    np.testing.assert_allclose(updates["w"], -0.1 * 0.5 * params["w"], rtol=1e-6)


def test_clipping_bounds_the_first_adam_step_input():
    params = {"w": jnp.zeros((2, 2))}
    opt = _opt(lr=1.0, warmup_steps=0, schedule="constant", weight_decay=0.0, clip_norm=1.0)
    tx, _ = make_optimizer(opt, 10, params)
    state = tx.init(params)
    _, state = tx.update({"w": jnp.full((2, 2), 100.0)}, state, params)
    mu = state.inner_states["train"].inner_state[1][0].mu["w"]
    # clipped gradient has global norm 1 (each entry 0.5); mu = (1 - b1) * g
    np.testing.assert_allclose(mu, (1 - opt.b1) * 0.5 * np.ones((2, 2)), rtol=1e-6)


def test_unknown_schedule_is_named():
    with pytest.raises(ValueError, match="config.optimizer.schedule"):
        make_schedule(_opt(schedule="exp"), 10)


def test_bf16_first_moment_halves_its_bytes_and_tracks_the_float32_update():
    params = _params()
    grads = jax.tree.map(lambda p: 0.1 * jnp.cos(p + 1.0), params)
    kw = dict(lr=0.1, warmup_steps=0, schedule="constant", clip_norm=0.0)
    updates = {}
    for mu_dtype in ("", "bfloat16"):
        tx, _ = make_optimizer(_opt(mu_dtype=mu_dtype, **kw), 10, params)
        state = tx.init(params)
        mus = [
            leaf
            for path, leaf in jax.tree_util.tree_leaves_with_path(state)
            if "mu" in jax.tree_util.keystr(path)
        ]
        assert mus and {m.dtype for m in mus} == {jnp.dtype(mu_dtype or jnp.float32)}, (
            f"mu_dtype={mu_dtype!r}: first moments in {[m.dtype for m in mus]}"
        )
        for _ in range(3):
            upd, state = tx.update(grads, state, params)
        updates[mu_dtype] = upd
    # bf16 keeps ~3 significant digits of the moment: the update moves by about that much.
    chex.assert_trees_all_close(updates["bfloat16"], updates[""], rtol=2e-2, atol=1e-6)


def test_unknown_mu_dtype_is_refused():
    from c2.train.config import ConfigError, validate_stage

    config = stage_defaults()
    config.optimizer.mu_dtype = "float16"
    with pytest.raises(ConfigError, match="optimizer.mu_dtype"):
        validate_stage(config, num_devices=1)
