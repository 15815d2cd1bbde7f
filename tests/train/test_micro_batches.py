"""Gradient accumulation (`config.train.micro_batches`, `make_step_fn(micro_batches=n)`): on a tiny
MoE model in float32 the accumulated step equals the whole-batch step when the loss is a token
mean, with rows holding different numbers of target tokens (each micro-batch weighted by its
tokens): the same gradient (an SGD step of rate 1 makes the parameter change the gradient), loss,
metrics and router-bias update; the compiled step keeps less; a batch that does not split is
refused by name."""

import functools

import chex
import jax
import numpy as np
import optax
import pytest

from c2 import model as model_lib
from c2.train import lm
from c2.train.config import ConfigError
from c2.train.step import make_step_fn
from tests.train.test_lm import small_config

ROWS, SEQ, VOCAB = 8, 32, 256


def _setup(mtp_weight: float = 0.0):
    c = small_config(seq_len=SEQ)
    c.model.overrides.vocab_size = VOCAB
    c.train.mtp_weight, c.train.balance_weight = mtp_weight, 0.0
    cfg = lm.model_config(c)
    params = model_lib.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    # Row r has SEQ - 3 r real tokens (then padding): micro-batches hold different token counts.
    lengths = SEQ - 3 * np.arange(ROWS)
    seg = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
    batch = {
        "inputs": rng.integers(0, VOCAB, (ROWS, SEQ)).astype(np.int32),
        "targets": rng.integers(0, VOCAB, (ROWS, SEQ)).astype(np.int32),
        "segment_ids": seg,
        "positions": np.where(seg > 0, np.arange(SEQ)[None], 0).astype(np.int32),
        "loss_mask": seg.astype(np.float32),
        "target_bytes": seg,
    }
    loss_fn = functools.partial(lm.lm_loss, cfg=cfg, tc=c.train, mesh=None)
    post = lambda p, aux: model_lib.update_router_bias(p, aux, cfg, 0.1)  # noqa: E731
    return params, batch, loss_fn, post


@functools.cache
def _run(mtp_weight: float, n: int):
    """(params before, batch, params after, metrics) of one SGD step in n micro-batches."""
    params, batch, loss_fn, post = _setup(mtp_weight)
    new, metrics = _step(params, batch, loss_fn, post, n)
    return params, batch, new, metrics


def _step(params, batch, loss_fn, post, n: int):
    tx = optax.sgd(1.0)
    step = jax.jit(make_step_fn(loss_fn, tx, lambda s: 1.0, post, micro_batches=n))
    rng = jax.random.key_data(jax.random.key(1))
    new, _, _, metrics = step(params, tx.init(params), rng, 0, batch)
    return new, metrics


@pytest.mark.parametrize("n", [2, 4])
def test_accumulated_step_equals_the_whole_batch_step(n):
    params, batch, whole, m_whole = _run(0.0, 1)
    _, _, acc, m_acc = _run(0.0, n)
    # The router bias moves by the sign of (mean load - load): summed loads give the same signs.
    bias = lambda p: p["moe_layers"]["mlp"]["router_bias"]  # noqa: E731
    assert np.abs(np.asarray(bias(whole) - bias(params))).max() > 0
    np.testing.assert_array_equal(bias(acc), bias(whole))
    chex.assert_trees_all_close(acc, whole, rtol=1e-4, atol=1e-6)
    assert (
        float(m_acc["target_tokens"]) == float(m_whole["target_tokens"]) == batch["loss_mask"].sum()
    )
    for key in ("loss", "ce_loss", "bpb", "grad_norm", "update_norm"):
        np.testing.assert_allclose(m_acc[key], m_whole[key], rtol=1e-5, err_msg=key)


def test_accumulated_mtp_loss_is_the_token_weighted_mean():
    """The MTP distillation is a mean over its own positions (one fewer per row and depth), so
    with uneven rows it is weighted by target tokens only approximately: close, not equal."""
    _, _, _, m_whole = _run(0.5, 1)
    _, _, _, m_acc = _run(0.5, 2)
    np.testing.assert_allclose(m_acc["mtp_loss"], m_whole["mtp_loss"], rtol=2e-2)
    np.testing.assert_allclose(m_acc["loss"], m_whole["loss"], rtol=1e-2)


def test_micro_batches_keep_fewer_temporaries():
    params, batch, loss_fn, post = _setup()
    tx = optax.sgd(1.0)

    def temp(n):
        step = jax.jit(make_step_fn(loss_fn, tx, lambda s: 1.0, post, micro_batches=n))
        rng = jax.random.key_data(jax.random.key(1))
        compiled = step.lower(params, tx.init(params), rng, 0, batch).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    assert temp(4) < temp(1)


def test_a_batch_that_does_not_split_is_refused():
    params, batch, loss_fn, post = _setup()
    with pytest.raises(ValueError, match=r"batch of 8 rows is not divisible by micro_batches=3"):
        _step(params, batch, loss_fn, post, 3)
    with pytest.raises(ValueError, match=r"micro_batches=0: expected a positive int"):
        make_step_fn(loss_fn, optax.sgd(1.0), lambda s: 1.0, micro_batches=0)
    c = small_config(seq_len=SEQ)
    c.data.batch_size, c.train.micro_batches = 8, 3
    with pytest.raises(ConfigError, match=r"config\.train\.micro_batches=3"):
        lm.validate(c, 1, load_files=False)
