"""Attention: MLA (DeepSeek-V3 / Kimi-K2) and GQA with q/k norm (Qwen3-MoE).

Training path: full sequences with packed documents (segment ids) and causal masking. Context
parallelism splits `seq` over the `context` mesh axis; keys and values are all-gathered over it
(sharding constraints), queries stay local.
Cached path (prefill / decode): one KV cache row per sequence, written at that row's position.
MLA caches only the compressed latent and the rope key, and attends in the latent space
(the up-projection is absorbed into the query and the output).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from c2.model.config import ModelConfig
from c2.model.layers import (
    apply_rope,
    einsum_f32,
    linear,
    rms_norm,
    rope_cos_sin,
    softmax_scale,
)
from c2.sharding import constrain

NEG_INF = -1e30  # finite, so fully-masked rows (padding) give a uniform softmax, not NaN


def attention_mask(
    q_seg: jax.Array, k_seg: jax.Array, q_idx: jax.Array, k_idx: jax.Array
) -> jax.Array:
    """[B, T, S] True where query t may attend key s: same document and not in the future."""
    same = q_seg[:, :, None] == k_seg[:, None, :]
    causal = k_idx[:, None, :] <= q_idx[:, :, None]
    return same & causal


def attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Softmax attention in float32. q [B,T,N,d], k [B,S,Kh,d], v [B,S,Kh,dv], N = Kh * groups."""
    B, T, N, d = q.shape
    Kh = k.shape[2]
    qg = q.reshape(B, T, Kh, N // Kh, d)
    s = einsum_f32("btkgd,bskd->bkgts", qg, k) * scale
    s = jnp.where(mask[:, None, None], s, NEG_INF)
    p = jax.nn.softmax(s, axis=-1)
    # Output in the dot's natural layout, then transposed: asking the einsum for "btkgd" makes
    # XLA:CPU fall back to a slow generic dot, in the forward pass and in the backward.
    o = einsum_f32("bkgts,bskd->bkgtd", p.astype(v.dtype), v).transpose(0, 3, 1, 2, 4)
    return o.reshape(B, T, N, v.shape[-1]).astype(q.dtype)


def _write_cache(buf: jax.Array, new: jax.Array, pos: jax.Array) -> jax.Array:
    """Write new [B, T, ...] into buf [B, S, ...] at row-wise offsets pos [B]."""

    def one(b, n, p):
        return jax.lax.dynamic_update_slice_in_dim(b, n.astype(b.dtype), p, axis=0)

    return jax.vmap(one)(buf, new, pos)


def _cache_mask(pos: jax.Array, T: int, S: int) -> jax.Array:
    """Query t of row b sits at pos[b] + t and sees cache slots <= itself."""
    q_idx = pos[:, None] + jnp.arange(T)[None]
    return jnp.arange(S)[None, None, :] <= q_idx[:, :, None]


# MLA ------------------------------------------------------------------------------------------


def _mla_q(x, p, c):
    if c.q_lora_rank:
        q = linear(rms_norm(linear(x, p["wq_a"], c), p["q_norm"], c.rms_norm_eps), p["wq_b"], c)
    else:
        q = linear(x, p["wq"], c)
    return q[..., : c.qk_nope_head_dim], q[..., c.qk_nope_head_dim :]


def mla(x, p, c: ModelConfig, positions, segment_ids, mesh: Mesh | None, cache=None):
    """Multi-head latent attention. x [B,T,H] -> ([B,T,H], updated cache or None)."""
    cos, sin = rope_cos_sin(positions, c)
    q_nope, q_rope = _mla_q(x, p, c)
    q_rope = apply_rope(q_rope, cos, sin, c.rope_interleave)
    kv_a = linear(x, p["wkv_a"], c)
    latent = rms_norm(kv_a[..., : c.kv_lora_rank], p["kv_norm"], c.rms_norm_eps)  # [B,T,r]
    k_rope = apply_rope(kv_a[..., None, c.kv_lora_rank :], cos, sin, c.rope_interleave)[:, :, 0]
    scale = softmax_scale(c)
    w_uk = p["wkv_b"][..., : c.qk_nope_head_dim].astype(x.dtype)  # [r, N, nope]
    w_uv = p["wkv_b"][..., c.qk_nope_head_dim :].astype(x.dtype)  # [r, N, v]

    if cache is None:
        kv = linear(latent, p["wkv_b"], c)  # [B,T,N,nope+v]
        k = jnp.concatenate(
            [
                kv[..., : c.qk_nope_head_dim],
                jnp.broadcast_to(k_rope[:, :, None], (*kv.shape[:3], c.qk_rope_head_dim)),
            ],
            -1,
        )
        v = kv[..., c.qk_nope_head_dim :]
        q = jnp.concatenate([q_nope, q_rope], -1)
        q = constrain(q, mesh, ("batch", "seq", "heads", None))
        k = constrain(k, mesh, ("batch", None, "heads", None))  # all-gather over context
        v = constrain(v, mesh, ("batch", None, "heads", None))
        idx = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
        k_seg = constrain(segment_ids, mesh, ("batch", None))
        mask = attention_mask(segment_ids, k_seg, idx, constrain(idx, mesh, ("batch", None)))
        o = attend(q, k, v, mask, scale)
        return linear(o, p["wo"], c, n_in=2), None

    pos = cache["pos"]
    cache = dict(
        cache,
        latent=_write_cache(cache["latent"], latent, pos),
        k_rope=_write_cache(cache["k_rope"], k_rope, pos),
    )
    lat, kr = cache["latent"].astype(x.dtype), cache["k_rope"].astype(x.dtype)
    q_lat = einsum_f32("btnd,rnd->btnr", q_nope, w_uk)
    s = (
        einsum_f32("btnr,bsr->bnts", q_lat.astype(x.dtype), lat)
        + einsum_f32("btnd,bsd->bnts", q_rope, kr)
    ) * scale
    mask = _cache_mask(pos, x.shape[1], lat.shape[1])
    s = jnp.where(mask[:, None], s, NEG_INF)
    prob = jax.nn.softmax(s, axis=-1).astype(x.dtype)
    o_lat = einsum_f32("bnts,bsr->bntr", prob, lat).transpose(0, 2, 1, 3)  # see attend
    o = einsum_f32("btnr,rnv->btnv", o_lat.astype(x.dtype), w_uv).astype(x.dtype)
    return linear(o, p["wo"], c, n_in=2), cache


# GQA ------------------------------------------------------------------------------------------


def gqa(x, p, c: ModelConfig, positions, segment_ids, mesh: Mesh | None, cache=None):
    """Grouped-query attention with per-head RMSNorm on q and k (Qwen3)."""
    cos, sin = rope_cos_sin(positions, c)
    q = rms_norm(linear(x, p["wq"], c), p["q_norm"], c.rms_norm_eps)
    k = rms_norm(linear(x, p["wk"], c), p["k_norm"], c.rms_norm_eps)
    v = linear(x, p["wv"], c)
    q = apply_rope(q, cos, sin, interleave=False)
    k = apply_rope(k, cos, sin, interleave=False)
    scale = softmax_scale(c)
    if cache is None:
        q = constrain(q, mesh, ("batch", "seq", "heads", None))
        k = constrain(k, mesh, ("batch", None, "kv_heads", None))
        v = constrain(v, mesh, ("batch", None, "kv_heads", None))
        idx = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
        k_seg = constrain(segment_ids, mesh, ("batch", None))
        mask = attention_mask(segment_ids, k_seg, idx, constrain(idx, mesh, ("batch", None)))
        return linear(attend(q, k, v, mask, scale), p["wo"], c, n_in=2), None
    pos = cache["pos"]
    cache = dict(cache, k=_write_cache(cache["k"], k, pos), v=_write_cache(cache["v"], v, pos))
    mask = _cache_mask(pos, x.shape[1], cache["k"].shape[1])
    o = attend(q, cache["k"].astype(x.dtype), cache["v"].astype(x.dtype), mask, scale)
    return linear(o, p["wo"], c, n_in=2), cache


def attention(x, p, c: ModelConfig, positions, segment_ids, mesh=None, cache=None):
    fn = mla if c.is_mla else gqa
    return fn(x, p, c, positions, segment_ids, mesh, cache)


def init_layer_cache(c: ModelConfig, n_layers: int, batch: int, max_len: int, dtype) -> dict:
    """Per-layer-group cache arrays, stacked on a leading layer axis."""
    if c.is_mla:
        return {
            "latent": jnp.zeros((n_layers, batch, max_len, c.kv_lora_rank), dtype),
            "k_rope": jnp.zeros((n_layers, batch, max_len, c.qk_rope_head_dim), dtype),
        }
    shape = (n_layers, batch, max_len, c.n_kv_heads, c.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
