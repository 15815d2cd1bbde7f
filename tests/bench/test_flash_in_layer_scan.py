"""Blockwise attention inside a `lax.scan` over layers (the model's layer stack), differentiated:
the outer scan's autodiff must not stack the per-block scores of the inner loops as residuals
(with `fori_loop` it did: the whole [T, S] score matrix per layer, 549 GB per device for Kimi-K2
at 32k, found by c2.bench.plan). The loops are `flash.block_loop` while loops now."""

import jax
import jax.numpy as jnp

from c2.model import flash


def test_layer_scan_of_flash_attention_keeps_no_score_blocks():
    B, T, N, d, block = 1, 1024, 2, 16, 128
    seg = jnp.ones((B, T), jnp.int32)
    idx = jnp.broadcast_to(jnp.arange(T), (B, T))

    def layer(x, w):
        q = jnp.einsum("btnd,de->btne", x, w)
        return x + flash.flash_attention(q, q, q, seg, seg, idx, idx, 0.25, block, block), None

    def loss(x, w_LDD):
        y, _ = jax.lax.scan(jax.checkpoint(layer, prevent_cse=False), x, w_LDD)
        return jnp.sum(y)

    x, w = jnp.ones((B, T, N, d)), jnp.ones((2, d, d)) * 0.1
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    n_blocks = T // block
    jaxpr = str(jax.make_jaxpr(grad)(x, w))
    assert f"[{n_blocks},{n_blocks}," not in jaxpr  # no [q blocks, kv blocks, ...] residuals
    temp = grad.lower(x, w).compile().memory_analysis().temp_size_in_bytes
    assert temp < B * N * T * T * 4  # less than one layer's score matrix
