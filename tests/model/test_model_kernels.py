"""The model with the Pallas kernels (interpret mode on CPU) equals the model with XLA ops.

`mxfp8_impl="pallas"` runs every dense projection through the MXFP8 quantise + block-scaled matmul
kernels and every expert GEMM through the grouped ones; `router_impl="pallas"` computes gates,
counts and the expert-sorted order with the router-replay kernel (gates only under expert
parallelism, which sorts in its exchange). Same loss, same gradients.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2 import model, sharding


def _loss_and_grads(c, p, toks, routing=None):
    def loss(p):
        logits, aux = model.forward(p, toks, c, routing=routing)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 7]), aux["topk_idx"]

    return jax.jit(jax.value_and_grad(loss, has_aux=True))(p)


# Every kind of layer once (interpret-mode kernels compile per layer, and the CPU unrolls the
# layers): Kimi-K2 1 dense + 1 MoE layer + its MTP block; Qwen3 one MoE layer.
LAYERS = {"tiny_kimi_k2": 2, "tiny_qwen3_moe": 1}


def _setup(name, layers=None, **kw):
    c = model.presets.get(name, dtype="float32", n_layers=layers or LAYERS[name], **kw)
    p = model.init_params(c, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (2, 24), 0, c.vocab_size, jnp.int32)
    return c, p, toks


@pytest.mark.parametrize("name", ["tiny_kimi_k2", "tiny_qwen3_moe"])
def test_mxfp8_pallas_kernels_in_the_model_match_xla(name):
    c, p, toks = _setup(name, quant="mxfp8")
    (want, idx_x), g_want = _loss_and_grads(c, p, toks)
    (got, idx_p), g_got = _loss_and_grads(c.replace(mxfp8_impl="pallas"), p, toks)
    np.testing.assert_array_equal(idx_p, idx_x)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    chex.assert_trees_all_close(g_got, g_want, atol=1e-6, rtol=1e-4)
    # MXFP8 is not the float32 model: the comparison above is not vacuous.
    (ref, _), _ = _loss_and_grads(c.replace(quant="bf16"), p, toks)
    assert abs(float(ref) - float(want)) > 1e-5


@pytest.mark.parametrize("name", ["tiny_kimi_k2", "tiny_qwen3_moe"])
def test_router_replay_kernel_in_the_model_matches_xla(name):
    c, p, toks = _setup(name)
    ck = c.replace(router_impl="pallas")
    (want, idx), g_want = _loss_and_grads(c, p, toks)
    (got, idx_k), g_got = _loss_and_grads(ck, p, toks)
    np.testing.assert_array_equal(idx_k, idx)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    chex.assert_trees_all_close(g_got, g_want, atol=1e-6, rtol=1e-5)
    assert float(jnp.abs(g_got["moe_layers"]["mlp"]["router"]).max()) > 0
    # Replaying other experts through the kernel: the same as through the XLA path.
    other = (idx + 3) % c.n_experts
    (want, _), g_want = _loss_and_grads(c, p, toks, other)
    (got, idx_o), g_got = _loss_and_grads(ck, p, toks, other)
    np.testing.assert_array_equal(idx_o, other)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    chex.assert_trees_all_close(g_got, g_want, atol=1e-6, rtol=1e-5)


def test_router_kernel_with_expert_parallelism_computes_gates_only_and_matches_xla():
    """EP > 1 sorts in its own exchange: the kernel's sorted order is not computed there (only
    the local dispatch runs the positions kernel), and loss and gradients equal the XLA router."""
    c = model.presets.get("tiny_qwen3_moe", dtype="float32")
    mesh = sharding.make_mesh(expert=8)
    p = model.init_params(c, jax.random.key(0), mesh)
    toks = jax.random.randint(jax.random.key(1), (8, 16), 0, c.vocab_size, jnp.int32)
    ck = c.replace(router_impl="pallas")

    def loss(p, cc, mesh):
        logits, _ = model.forward(p, toks, cc, mesh=mesh)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 7])

    for cc, m, positions in ((ck, mesh, False), (ck, None, True)):
        jaxpr = str(jax.make_jaxpr(lambda p, cc=cc, m=m: loss(p, cc, m))(p))
        assert "router_replay_gates" in jaxpr
        assert ("router_replay_positions" in jaxpr) == positions
    grad = jax.jit(jax.value_and_grad(loss), static_argnums=(1, 2))
    want, g_want = grad(p, c, mesh)
    got, g_got = grad(p, ck, mesh)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    chex.assert_trees_all_close(g_got, g_want, atol=1e-6, rtol=1e-5)
    assert float(jnp.abs(g_got["moe_layers"]["mlp"]["router"]).max()) > 0


@pytest.mark.parametrize("router_impl", ["xla", "pallas"])
def test_forward_rejects_bad_replayed_experts_by_position(router_impl):
    c, p, toks = _setup("tiny_qwen3_moe", layers=2, router_impl=router_impl)
    _, aux = model.forward(p, toks, c)
    idx = np.asarray(aux["topk_idx"])  # [L_moe, B, T, k]
    bad = idx.copy()
    bad[1, 0, 5, 2] = c.n_experts
    with pytest.raises(ValueError, match=r"routing\[1, 0, 5, 2\] = 16: expert index out of range"):
        model.forward(p, toks, c, routing=bad)
    bad = idx.copy()
    bad[0, 1, 3, 1] = bad[0, 1, 3, 0]
    with pytest.raises(ValueError, match=r"routing\[0, 1, 3, 1\] = \d+: expert repeated"):
        model.forward(p, toks, c, routing=jnp.asarray(bad))
    with pytest.raises(ValueError, match="routing has shape"):
        model.forward(p, toks, c, routing=idx[..., :2])


def test_bad_replayed_experts_inside_jit_stay_contained():
    """Traced routing cannot be checked. An out-of-range expert reads nothing out of bounds and
    touches no other sequence: the XLA path's gather fills NaN (the sequence's loss is NaN, so the
    mistake surfaces), the kernel drops the slot (gate 0, the pair sorted after every valid one)."""
    c, p, toks = _setup("tiny_qwen3_moe")
    clean, aux = model.forward(p, toks, c)
    bad = aux["topk_idx"].at[0, 0, 4, 1].set(10_000)
    for impl in ("xla", "pallas"):
        cc = c.replace(router_impl=impl)
        logits, _ = jax.jit(lambda r, cc=cc: model.forward(p, toks, cc, routing=r))(bad)
        np.testing.assert_allclose(logits[1], clean[1], rtol=1e-5, atol=1e-5)
        assert np.isfinite(np.asarray(logits[0])).all() == (impl == "pallas"), impl
