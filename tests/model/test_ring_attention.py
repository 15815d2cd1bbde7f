"""Ring attention over the context axis equals single-device dense attention (8 CPU devices)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2 import model, sharding
from c2.model import attention, ring

MESHES = {
    # mesh, (B, T, N, Kh, d, dv)
    "context8-mla_dims": (dict(context=8), (2, 64, 4, 4, 24, 16)),
    "context4-tensor2-gqa": (dict(context=4, tensor=2), (2, 64, 8, 2, 8, 8)),
    "data2-context4": (dict(data=2, context=4), (2, 48, 4, 4, 8, 8)),
}


def _packed(B, T):
    """Row 0: documents that cross shard boundaries, then a padding segment (id 0)."""
    row0 = np.repeat([1, 2, 3, 0], [T // 8, T // 2, T // 4, T - T // 8 - T // 2 - T // 4])
    return jnp.asarray(np.stack([row0, np.full(T, 4)][:B]), jnp.int32)


def _dense(q, k, v, seg, scale):
    idx = jnp.broadcast_to(jnp.arange(q.shape[1]), seg.shape)
    return attention.attend(q, k, v, attention.attention_mask(seg, seg, idx, idx), scale)


@pytest.mark.parametrize("case", MESHES, ids=list(MESHES))
def test_ring_equals_dense_forward_and_grads(case):
    chex.assert_equal(jax.device_count(), 8)
    shape, (B, T, N, Kh, d, dv) = MESHES[case]
    mesh = sharding.make_mesh(**shape)
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (B, T, N, d))
    k = jax.random.normal(ks[1], (B, T, Kh, d))
    v = jax.random.normal(ks[2], (B, T, Kh, dv))
    r = jax.random.normal(ks[3], (B, T, N, dv))
    seg = _packed(B, T)
    scale = d**-0.5
    kv_heads = "heads" if Kh == N else "kv_heads"

    def run(f):
        loss = lambda q, k, v: jnp.sum(f(q, k, v) * r)  # noqa: E731
        return f(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v)

    want = run(lambda q, k, v: _dense(q, k, v, seg, scale))
    got = jax.jit(
        lambda: run(
            lambda q, k, v: ring.context_attention(
                q, k, v, seg, scale=scale, mesh=mesh, kv_heads=kv_heads, block_q=4, block_kv=4
            )
        )
    )()
    chex.assert_trees_all_close(got, want, atol=2e-5, rtol=1e-5)


def test_ring_passes_kv_by_collective_permute():
    """The keys move around the ring (collective-permute), they are not all-gathered."""
    mesh = sharding.make_mesh(context=8)
    q = jnp.ones((1, 64, 2, 8))
    seg = jnp.ones((1, 64), jnp.int32)

    def f(q):
        return ring.context_attention(q, q, q, seg, scale=1.0, mesh=mesh, block_q=8, block_kv=8)

    hlo = jax.jit(jax.grad(lambda q: jnp.sum(f(q)))).lower(q).compile().as_text()
    assert "collective-permute" in hlo
    assert "all-gather" not in hlo


def test_model_ring_equals_single_device_dense():
    """Whole model (MLA), context 2 x expert 2 x data 2, packed documents: blockwise + ring
    attention gives the single-device dense logits and gradients."""
    c = model.presets.get(
        "tiny_kimi_k2",
        dtype="float32",
        n_layers=2,
        mtp_depth=0,
        attention_block_q=4,
        attention_block_kv=4,
    )
    p = model.init_params(c, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (4, 16), 0, c.vocab_size, jnp.int32)
    seg = jnp.ones((4, 16), jnp.int32).at[:, 6:].set(2).at[0, 13:].set(0)

    def loss(p, toks, cc, mesh):
        logits, aux = model.forward(p, toks, cc, segment_ids=seg, mesh=mesh)
        return jnp.mean(jax.nn.logsumexp(logits, -1)) + aux["balance_loss"], logits

    step = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=(2, 3))
    ref = step(p, toks, c.replace(attention_impl="dense"), None)
    mesh = sharding.make_mesh(data=2, expert=2, context=2)
    ps = model.init_params(c, jax.random.key(0), mesh)
    toks = jax.device_put(toks, sharding.batch_sharding(mesh))
    out = step(ps, toks, c.replace(attention_impl="blockwise"), mesh)
    chex.assert_trees_all_close(out, ref, atol=2e-5, rtol=1e-5)
