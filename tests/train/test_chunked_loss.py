"""The chunked language-model loss (`config.train.loss_chunk_tokens`): the same loss, metrics and
gradients as the whole-logits path on a tiny model with an MTP module, in float32, and the
compiled step holds less memory; a chunk that does not divide the sequence is refused by name."""

import functools

import chex
import jax
import numpy as np
import pytest

from c2 import model as model_lib
from c2.train import lm
from c2.train.config import ConfigError, validate_stage
from tests.train.test_lm import small_config


def _tiny(vocab: int = 256, seq: int = 32):
    c = small_config(seq_len=seq)
    c.model.overrides.vocab_size = vocab
    c.train.mtp_weight, c.train.balance_weight = 0.5, 0.01
    cfg = lm.model_config(c)
    params = model_lib.init_params(cfg, jax.random.key(0))
    rng = np.random.default_rng(0)
    seg = np.repeat(np.array([[1] * (seq - 12) + [2] * 10 + [0] * 2]), 2, axis=0)
    pos = np.concatenate([np.arange(seq - 12), np.arange(10), [0, 0]])[None].repeat(2, 0)
    batch = {
        "inputs": rng.integers(0, vocab, (2, seq)).astype(np.int32),
        "targets": rng.integers(0, vocab, (2, seq)).astype(np.int32),
        "segment_ids": seg.astype(np.int32),
        "positions": pos.astype(np.int32),
        "loss_mask": (seg > 0).astype(np.float32),
        "target_bytes": (seg > 0).astype(np.int32),
    }
    return c, cfg, params, batch


def _loss_and_grads(c, cfg, params, batch, chunk: int):
    c.train.loss_chunk_tokens = chunk
    loss_fn = functools.partial(lm.lm_loss, cfg=cfg, tc=c.train, mesh=None)
    fn = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, batch, None), has_aux=True))
    (loss, (metrics, _)), grads = fn(params)
    return loss, metrics, grads


@pytest.mark.parametrize("chunk", [8, 16])
def test_chunked_loss_equals_the_whole_logits_path(chunk):
    c, cfg, params, batch = _tiny()
    assert cfg.mtp_depth >= 1
    loss, metrics, grads = _loss_and_grads(c, cfg, params, batch, 0)
    c_loss, c_metrics, c_grads = _loss_and_grads(c, cfg, params, batch, chunk)
    np.testing.assert_allclose(c_loss, loss, rtol=1e-5)
    assert set(c_metrics) == set(metrics)
    for k in metrics:
        np.testing.assert_allclose(c_metrics[k], metrics[k], rtol=1e-5, atol=1e-6, err_msg=k)
    chex.assert_trees_all_close(c_grads, grads, rtol=1e-4, atol=1e-6)


def test_chunked_loss_compiles_to_fewer_temporaries():
    """A vocabulary large enough that the [B, T, V] float32 logits dominate the step."""
    c, cfg, params, batch = _tiny(vocab=8192, seq=256)

    def temp_bytes(chunk):
        c.train.loss_chunk_tokens = chunk
        loss_fn = functools.partial(lm.lm_loss, cfg=cfg, tc=c.train, mesh=None)
        step = jax.jit(jax.grad(lambda p: loss_fn(p, batch, None)[0]))
        return step.lower(params).compile().memory_analysis().temp_size_in_bytes

    logits_bytes = 2 * 256 * 8192 * 4
    whole, chunked = temp_bytes(0), temp_bytes(32)
    assert whole > 3 * logits_bytes  # logits, softmaxes, gradients, MTP head: several copies
    assert chunked < whole / 3, (chunked, whole)


def test_loss_chunk_must_divide_the_sequence():
    c = small_config(seq_len=32)
    c.train.loss_chunk_tokens = 12
    with pytest.raises(ConfigError, match=r"config\.train\.loss_chunk_tokens=12: must divide"):
        validate_stage(c, 1)
    c.train.loss_chunk_tokens = -1
    with pytest.raises(ConfigError, match=r"config\.train\.loss_chunk_tokens: expected >= 0"):
        validate_stage(c, 1)
