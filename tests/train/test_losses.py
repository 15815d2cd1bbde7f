"""Losses against plain numpy references: masked CE, MTP self-distillation, bits per byte."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2.train.losses import bits_per_byte, mtp_distillation, next_token_loss


def _log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_next_token_loss_is_masked_mean_nll():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
    targets = rng.integers(0, 7, size=(2, 5))
    mask = (rng.random((2, 5)) > 0.3).astype(np.float32)
    loss, nll_sum, n = next_token_loss(jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(mask))
    lp = _log_softmax(logits)
    nll = -np.take_along_axis(lp, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(nll_sum, (nll * mask).sum(), rtol=1e-5)
    np.testing.assert_allclose(n, mask.sum())
    np.testing.assert_allclose(loss, (nll * mask).sum() / mask.sum(), rtol=1e-5)


def _mtp_reference(mtp, logits, seg, mask, kind):
    D, B, T, V = mtp.shape
    losses, accepts = [], []
    for d in range(1, D + 1):
        tot, acc, n = 0.0, 0.0, 0
        for b in range(B):
            for t in range(T - d):
                if seg[b, t] == 0 or seg[b, t] != seg[b, t + d] or mask[b, t + d] == 0:
                    continue
                lt = _log_softmax(logits[b, t + d])
                ls = _log_softmax(mtp[d - 1, b, t])
                ce = -(np.exp(lt) * ls).sum()
                tot += ce + ((np.exp(lt) * lt).sum() if kind == "kl" else 0.0)
                acc += float(np.argmax(mtp[d - 1, b, t]) == np.argmax(logits[b, t + d]))
                n += 1
        losses.append(tot / max(n, 1))
        accepts.append(acc / max(n, 1))
    return np.mean(losses), accepts


@pytest.mark.parametrize("kind", ["kl", "ce"])
def test_mtp_distillation_matches_reference(kind):
    rng = np.random.default_rng(1)
    D, B, T, V = 2, 2, 9, 5
    mtp = rng.normal(size=(D, B, T, V)).astype(np.float32)
    logits = rng.normal(size=(B, T, V)).astype(np.float32)
    seg = np.array([[1, 1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1, 0, 0, 0]])
    mask = (seg > 0).astype(np.float32)
    mask[0, 3] = 0  # last token of document 1: no target
    loss, metrics = mtp_distillation(
        jnp.asarray(mtp), jnp.asarray(logits), jnp.asarray(seg), jnp.asarray(mask), kind
    )
    want_loss, want_accept = _mtp_reference(mtp, logits, seg, mask, kind)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for d in (1, 2):
        np.testing.assert_allclose(metrics[f"mtp{d}_acceptance"], want_accept[d - 1], rtol=1e-6)
    # depth 1: doc 1 pairs (0,1),(1,2) [t+1=3 masked], doc 2 pairs 4..7 -> 4, row 2 -> 5
    assert float(metrics["mtp1_positions"]) == 2 + 4 + 5


def test_kl_is_zero_and_acceptance_one_when_mtp_equals_shifted_teacher():
    rng = np.random.default_rng(2)
    B, T, V = 1, 6, 4
    logits = rng.normal(size=(B, T, V)).astype(np.float32)
    mtp = np.zeros((1, B, T, V), np.float32)
    mtp[0, :, :-1] = logits[:, 1:]
    seg, mask = np.ones((B, T), np.int32), np.ones((B, T), np.float32)
    loss, metrics = mtp_distillation(jnp.asarray(mtp), jnp.asarray(logits), seg, mask, "kl")
    np.testing.assert_allclose(loss, 0.0, atol=1e-6)
    np.testing.assert_allclose(metrics["mtp1_acceptance"], 1.0)


def test_teacher_gets_no_gradient():
    rng = np.random.default_rng(3)
    mtp = jnp.asarray(rng.normal(size=(1, 1, 5, 3)), jnp.float32)
    logits = jnp.asarray(rng.normal(size=(1, 5, 3)), jnp.float32)
    seg, mask = jnp.ones((1, 5), jnp.int32), jnp.ones((1, 5))
    g_teacher, g_student = jax.grad(
        lambda lg, m: mtp_distillation(m, lg, seg, mask)[0], argnums=(0, 1)
    )(logits, mtp)
    np.testing.assert_array_equal(g_teacher, 0.0)
    assert float(jnp.abs(g_student).sum()) > 0


def test_bits_per_byte():
    # uniform over 256 byte values is exactly 8 bits per byte
    n = 10
    np.testing.assert_allclose(bits_per_byte(n * math.log(256.0), n), 8.0, rtol=1e-6)
    np.testing.assert_allclose(bits_per_byte(math.log(2.0) * 6, 3), 2.0, rtol=1e-6)
