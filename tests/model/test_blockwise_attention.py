"""Blockwise (flash-style) attention equals the dense path, forward and backward, in O(T) memory."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2 import model
from c2.model import attention, flash


def _inputs(B, T, N, Kh, d, dv, seed=0, dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (B, T, N, d), dtype)
    k = jax.random.normal(ks[1], (B, T, Kh, d), dtype)
    v = jax.random.normal(ks[2], (B, T, Kh, dv), dtype)
    r = jax.random.normal(ks[3], (B, T, N, dv), jnp.float32)
    return q, k, v, r


def _packed(B, T):
    """Row 0: three documents then a padding segment (id 0); row 1: one document."""
    a, b = T // 4, T // 2
    row0 = np.concatenate([np.full(a, 1), np.full(b - a, 2), np.full(T - b - 3, 5), np.zeros(3)])
    rows = [row0, np.full(T, 7)] + [np.full(T, 1)] * (B - 2)
    return jnp.asarray(np.stack(rows[:B]), jnp.int32)


def _tree(B, T):
    """Row 0: a trunk (segment 3), three branches of it, a padding tail; row 1: a document, a
    trunk (segment 1) with two branches, then a plain document after them."""
    n = T // 8
    trunk, br = np.full(2 * n, 3), [np.full(n + j, 3 + j * flash.BRANCH_STRIDE) for j in (1, 2, 3)]
    row0 = np.concatenate([trunk, *br])
    row0 = np.concatenate([row0, np.zeros(T - len(row0))])
    row1 = np.concatenate(
        [
            np.full(n, 2),
            np.full(n, 1),
            np.full(2 * n, 1 + flash.BRANCH_STRIDE),
            np.full(n, 1 + 2 * flash.BRANCH_STRIDE),
        ]
    )
    row1 = np.concatenate([row1, np.full(T - len(row1), 5)])
    rows = [row0, row1] + [np.full(T, 1)] * (B - 2)
    return jnp.asarray(np.stack(rows[:B]), jnp.int32)


def _dense(q, k, v, seg, scale):
    idx = jnp.broadcast_to(jnp.arange(q.shape[1]), seg.shape)
    return attention.attend(q, k, v, attention.attention_mask(seg, seg, idx, idx), scale)


def _flash(q, k, v, seg, scale, bq, bk):
    idx = jnp.broadcast_to(jnp.arange(q.shape[1]), seg.shape)
    return flash.flash_attention(q, k, v, seg, seg, idx, idx, scale, bq, bk)


def _value_and_grads(f, q, k, v, r):
    out = f(q, k, v)
    grads = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v).astype(jnp.float32) * r), (0, 1, 2))
    return out, grads(q, k, v)


CASES = {
    # name: (B, T, N, Kh, d, dv, packed, block_q, block_kv)
    "causal": (2, 64, 4, 4, 16, 16, False, 16, 16),
    "packed": (2, 64, 4, 4, 16, 16, True, 16, 8),
    "mla_dims": (2, 48, 4, 4, 24, 16, True, 16, 16),  # q/k head dim != v head dim
    "gqa": (2, 64, 8, 2, 8, 8, True, 32, 16),
    "uneven": (2, 37, 4, 2, 8, 12, True, 8, 16),  # T not a multiple of either block: padded
    "one_block": (1, 20, 2, 1, 8, 8, True, 512, 512),  # blocks larger than T
    "branches": (2, 64, 4, 2, 16, 8, "tree", 8, 16),  # branches see their trunk
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_blockwise_equals_dense_forward_and_grads(case):
    B, T, N, Kh, d, dv, packed, bq, bk = CASES[case]
    q, k, v, r = _inputs(B, T, N, Kh, d, dv)
    seg = {False: jnp.ones((B, T), jnp.int32), True: _packed(B, T), "tree": _tree(B, T)}[packed]
    scale = d**-0.5
    want = _value_and_grads(lambda q, k, v: _dense(q, k, v, seg, scale), q, k, v, r)
    got = _value_and_grads(jax.jit(lambda q, k, v: _flash(q, k, v, seg, scale, bq, bk)), q, k, v, r)
    chex.assert_trees_all_close(got, want, atol=2e-5, rtol=1e-5)


def test_a_branch_sees_its_trunk_and_itself_alone():
    """Tree segments (flash.BRANCH_STRIDE): each branch's outputs equal attention over the
    sequence trunk + that branch alone; the trunk's equal the trunk alone."""
    T = 64
    q, k, v, _ = _inputs(1, T, 4, 2, 16, 8)
    seg = _tree(1, T)
    got = _dense(q, k, v, seg, 0.25)
    ids = np.asarray(seg[0])
    trunk = np.flatnonzero(ids == 3)
    for j in (1, 2, 3):
        branch = np.flatnonzero(ids == 3 + j * flash.BRANCH_STRIDE)
        rows = np.concatenate([trunk, branch])
        one = jnp.ones((1, len(rows)), jnp.int32)
        want = _dense(q[:, rows], k[:, rows], v[:, rows], one, 0.25)
        np.testing.assert_allclose(got[:, branch], want[:, len(trunk) :], atol=1e-6)
        np.testing.assert_allclose(got[:, trunk], want[:, : len(trunk)], atol=1e-6)
    assert flash.segments_match(3 + flash.BRANCH_STRIDE, 3) and not flash.segments_match(
        3, 3 + flash.BRANCH_STRIDE
    )
    assert not flash.segments_match(3 + flash.BRANCH_STRIDE, 3 + 2 * flash.BRANCH_STRIDE)


def test_blockwise_bf16_tracks_dense():
    q, k, v, r = _inputs(2, 64, 4, 2, 16, 8, dtype=jnp.bfloat16)
    seg = _packed(2, 64)
    want = _value_and_grads(lambda q, k, v: _dense(q, k, v, seg, 0.25), q, k, v, r)
    got = _value_and_grads(lambda q, k, v: _flash(q, k, v, seg, 0.25, 16, 16), q, k, v, r)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert a.dtype == jnp.bfloat16
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= 0.03 * np.abs(b).max()


def test_rows_that_see_nothing_output_zero_and_finite_lse():
    """Keys all in the queries' future (a ring chunk from a later shard): zeros, lse NEG_INF."""
    q, k, v, _ = _inputs(1, 8, 2, 2, 8, 8)
    seg = jnp.ones((1, 8), jnp.int32)
    qi, ki = jnp.arange(8)[None], 100 + jnp.arange(8)[None]
    o, lse = flash.forward_parts(q, k, v, seg, seg, qi, ki, scale=1.0, block_q=4, block_kv=4)
    np.testing.assert_array_equal(o, 0.0)
    np.testing.assert_array_equal(lse, np.float32(flash.NEG_INF))


def test_block_size_must_be_positive():
    q, k, v, _ = _inputs(1, 8, 2, 2, 8, 8)
    seg = jnp.ones((1, 8), jnp.int32)
    with pytest.raises(ValueError, match="block size"):
        _flash(q, k, v, seg, 1.0, 0, 4)


def _temp_bytes(f, *args) -> int:
    grad = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a)), argnums=(0, 1, 2)))
    return grad.lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_blockwise_backward_has_no_quadratic_buffer():
    """Compiled fwd+bwd at T = S = 4096: the dense path's temporaries exceed one float32 score
    matrix B*N*T*S*4 (128 MiB here); the blockwise path's stay far below it (blocks only)."""
    B, T, N, d = 1, 4096, 2, 16
    q, k, v, _ = _inputs(B, T, N, N, d, d)
    seg = jnp.ones((B, T), jnp.int32)
    scores = B * N * T * T * 4
    dense = _temp_bytes(lambda q, k, v: _dense(q, k, v, seg, 0.25), q, k, v)
    blockwise = _temp_bytes(lambda q, k, v: _flash(q, k, v, seg, 0.25, 512, 512), q, k, v)
    assert dense > scores, (dense, scores)
    assert blockwise < scores / 8, (blockwise, scores)


# Model wiring -------------------------------------------------------------------------------------

FAMILIES = ["tiny_kimi_k2", "tiny_qwen3_moe"]
SMALL = dict(n_layers=2, first_k_dense=1, mtp_depth=0)  # compile time: every layer is unrolled


def test_config_fields_and_auto_resolution():
    c = model.presets.get("tiny_kimi_k2")
    assert c.attention_impl == "auto"
    assert attention.resolve_attention_impl(c, c.attention_dense_max_len) == "dense"
    assert attention.resolve_attention_impl(c, c.attention_dense_max_len + 1) == "blockwise"
    cudnn = c.replace(attention_impl="cudnn")
    want = "cudnn" if jax.default_backend() == "gpu" else "blockwise"
    assert attention.resolve_attention_impl(cudnn, 16) == want
    with pytest.raises(ValueError, match="attention_impl"):
        c.replace(attention_impl="flash")
    with pytest.raises(ValueError, match="attention_block_kv"):
        c.replace(attention_block_kv=0)


@pytest.mark.parametrize("name", FAMILIES)
def test_model_blockwise_equals_dense(name):
    """Whole model, packed documents with a padding tail: logits and parameter gradients."""
    c = model.presets.get(name, dtype="float32", attention_block_q=8, attention_block_kv=4, **SMALL)
    p = model.init_params(c, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (2, 24), 0, c.vocab_size, jnp.int32)
    seg = _packed(2, 24)

    def loss(p, cc):
        logits, _ = model.forward(p, toks, cc, segment_ids=seg)
        return jnp.mean(jax.nn.logsumexp(logits, -1)), logits

    step = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
    want = step(p, c.replace(attention_impl="dense"))
    got = step(p, c.replace(attention_impl="blockwise"))
    chex.assert_trees_all_close(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", FAMILIES)
def test_blockwise_prefill_matches_dense_prefill(name):
    """A long prompt's prefill attends the cache in blocks (MLA: in the latent space)."""
    c = model.presets.get(name, dtype="float32", attention_block_q=4, attention_block_kv=8, **SMALL)
    p = model.init_params(c, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (2, 12), 0, c.vocab_size, jnp.int32)
    lengths = jnp.array([12, 7])
    outs = []
    for impl in ("dense", "blockwise"):
        cc = c.replace(attention_impl=impl)
        cache = model.init_cache(cc, batch=2, max_len=20)
        cache = dict(cache, pos=jnp.array([0, 3], jnp.int32))  # a row that starts mid-cache
        logits, _, cache = model.prefill(p, toks, cache, lengths, cfg=cc)
        step, _, _ = model.decode_step(p, toks[:, :1], cache, cfg=cc)
        outs.append((logits, step))
    chex.assert_trees_all_close(outs[1], outs[0], atol=2e-5, rtol=1e-5)


@pytest.mark.gpu
def test_cudnn_equals_dense_on_gpu():
    """cuDNN flash attention (bf16) with MLA's head dims (v padded) and packed documents."""
    q, k, v, r = _inputs(2, 256, 4, 4, 192, 128, dtype=jnp.bfloat16)
    seg = _packed(2, 256)
    scale = 192**-0.5
    want = _value_and_grads(lambda q, k, v: _dense(q, k, v, seg, scale), q, k, v, r)
    got = _value_and_grads(
        jax.jit(lambda q, k, v: attention.cudnn_attend(q, k, v, seg, scale)), q, k, v, r
    )
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert np.abs(a - b).max() <= 0.03 * np.abs(b).max()
