"""Attention: MLA (DeepSeek-V3 / Kimi-K2) and GQA with q/k norm (Qwen3-MoE).

Training path: full sequences with packed documents (segment ids; a branch segment also sees its
trunk, `flash.BRANCH_STRIDE`) and causal masking, by one of
`ModelConfig.attention_impl` (`self_attention`):
  dense: float32 scores [B, heads, T, S]. Context parallelism splits `seq` over the `context` mesh
    axis; keys and values are all-gathered over it (sharding constraints), queries stay local.
  blockwise: flash-style attention in O(T) memory (c2/model/flash.py) inside a shard_map, ring
    attention over the `context` axis (c2/model/ring.py).
  cudnn: jax.nn.dot_product_attention(implementation="cudnn") on GPU (bf16/fp16); MLA's v head
    dim is zero-padded to the q/k head dim. The document mask is passed as a [B, 1, T, S] mask,
    so this is a speed choice for moderate lengths, not a memory one. Elsewhere: blockwise.
  auto (default): dense up to `attention_dense_max_len` tokens, blockwise beyond.
Cached path (prefill / decode): one KV cache row per sequence, written at that row's position.
MLA caches only the compressed latent and the rope key, and attends in the latent space
(the up-projection is absorbed into the query and the output).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from c2.model import flash
from c2.model.config import ModelConfig
from c2.model.layers import (
    apply_rope,
    einsum_f32,
    linear,
    rms_norm,
    rope_cos_sin,
    softmax_scale,
)
from c2.model.ring import context_attention
from c2.quant import target
from c2.sharding import constrain

NEG_INF = -1e30  # finite, so fully-masked rows (padding) give a uniform softmax, not NaN


def attention_mask(
    q_seg: jax.Array, k_seg: jax.Array, q_idx: jax.Array, k_idx: jax.Array
) -> jax.Array:
    """[B, T, S] True where query t may attend key s: same document (or s in t's trunk,
    `flash.segments_match`) and not in the future."""
    same = flash.segments_match(q_seg[:, :, None], k_seg[:, None, :])
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


def resolve_attention_impl(c: ModelConfig, seq_len: int) -> str:
    """The implementation `self_attention` uses for `seq_len` query tokens: dense, blockwise or
    cudnn ("auto" by length; "cudnn" only on GPU, blockwise elsewhere)."""
    impl = c.attention_impl
    if impl == "auto":
        return "dense" if seq_len <= c.attention_dense_max_len else "blockwise"
    if impl == "cudnn" and target.platform() != "gpu":
        return "blockwise"
    return impl


def cudnn_attend(q, k, v, segment_ids, scale: float) -> jax.Array:
    """cuDNN flash attention (GPU, bf16/fp16): causal, documents masked by segment id.

    jax.nn.dot_product_attention needs one head dim for q, k and v: MLA's smaller v head dim is
    zero-padded up to the q/k one (the extra output columns are zeros and are sliced off; their
    gradient is zero), a larger one pads q and k (zero columns add nothing to the scores)."""
    d, dv = q.shape[-1], v.shape[-1]
    pad = lambda x, n: jnp.pad(x, [(0, 0)] * 3 + [(0, n - x.shape[-1])])  # noqa: E731
    if dv < d:
        v = pad(v, d)
    elif dv > d:
        q, k = pad(q, dv), pad(k, dv)
    mask = flash.segments_match(segment_ids[:, :, None], segment_ids[:, None, :])[:, None]
    o = jax.nn.dot_product_attention(
        q, k, v, mask=mask, scale=scale, is_causal=True, implementation="cudnn"
    )
    return o[..., :dv]


def self_attention(q, k, v, segment_ids, scale: float, c: ModelConfig, mesh, kv_heads: str):
    """Causal self-attention of a packed batch: q [B,T,N,d], k [B,T,Kh,d], v [B,T,Kh,dv] ->
    [B,T,N,dv], by `resolve_attention_impl`. `kv_heads` is k/v's logical heads axis."""
    impl = resolve_attention_impl(c, q.shape[1])
    if impl == "cudnn" and q.dtype not in (jnp.bfloat16, jnp.float16):
        impl = "blockwise"  # cuDNN flash attention is half precision only
    if impl == "blockwise":
        return context_attention(
            q,
            k,
            v,
            segment_ids,
            scale=scale,
            mesh=mesh,
            kv_heads=kv_heads,
            block_q=c.attention_block_q,
            block_kv=c.attention_block_kv,
        )
    q = constrain(q, mesh, ("batch", "seq", "heads", None))
    k = constrain(k, mesh, ("batch", None, kv_heads, None))  # all-gather over context
    v = constrain(v, mesh, ("batch", None, kv_heads, None))
    k_seg = constrain(segment_ids, mesh, ("batch", None))
    if impl == "cudnn":
        return cudnn_attend(q, k, v, k_seg, scale)
    idx = jnp.broadcast_to(jnp.arange(q.shape[1]), segment_ids.shape)
    mask = attention_mask(segment_ids, k_seg, idx, constrain(idx, mesh, ("batch", None)))
    return attend(q, k, v, mask, scale)


def _cache_blockwise(c: ModelConfig, T: int) -> bool:
    """Prefill of a long prompt attends the cache in blocks too (decode steps stay dense)."""
    return T > 1 and resolve_attention_impl(c, T) != "dense"


def _cache_flash(q, k, v, pos, scale: float, c: ModelConfig) -> jax.Array:
    """Blockwise attention over a cache: query t of row b at pos[b] + t sees slots <= itself."""
    B, T = q.shape[:2]
    S = k.shape[1]
    ones_q, ones_k = jnp.ones((B, T), jnp.int32), jnp.ones((B, S), jnp.int32)
    q_idx = pos[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    k_idx = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
    return flash.flash_attention(
        q, k, v, ones_q, ones_k, q_idx, k_idx, scale, c.attention_block_q, c.attention_block_kv
    )


def _write_cache(buf: jax.Array, new: jax.Array, pos: jax.Array) -> jax.Array:
    """Write new [B, T, ...] into buf [B, S, ...] at row-wise offsets pos [B]."""

    def one(b, n, p):
        return jax.lax.dynamic_update_slice_in_dim(b, n.astype(b.dtype), p, axis=0)

    return jax.vmap(one)(buf, new, pos)


def _visible(buf: jax.Array, kv_len: int | None) -> jax.Array:
    """The first kv_len slots of a cache buffer [B, S, ...] (all of it when None): decoding
    attends only to the slots every row can have filled, not the whole preallocated length."""
    return buf if kv_len is None or kv_len >= buf.shape[1] else buf[:, :kv_len]


def _cache_mask(pos: jax.Array, T: int, S: int) -> jax.Array:
    """Query t of row b sits at pos[b] + t and sees cache slots <= itself."""
    q_idx = pos[:, None] + jnp.arange(T)[None]
    return jnp.arange(S)[None, None, :] <= q_idx[:, :, None]


# MLA ------------------------------------------------------------------------------------------


def _mla_q(x, p, c, mesh):
    if c.q_lora_rank:
        q = linear(x, p["wq_a"], c, mesh=mesh)
        q = linear(rms_norm(q, p["q_norm"], c.rms_norm_eps), p["wq_b"], c, mesh=mesh)
    else:
        q = linear(x, p["wq"], c, mesh=mesh)
    return q[..., : c.qk_nope_head_dim], q[..., c.qk_nope_head_dim :]


def mla(x, p, c: ModelConfig, positions, segment_ids, mesh: Mesh | None, cache=None, kv_len=None):
    """Multi-head latent attention. x [B,T,H] -> ([B,T,H], updated cache or None). With a cache,
    `kv_len` (static) limits attention to its first kv_len slots: every row's pos + T must fit."""
    cos, sin = rope_cos_sin(positions, c)
    q_nope, q_rope = _mla_q(x, p, c, mesh)
    q_rope = apply_rope(q_rope, cos, sin, c.rope_interleave)
    kv_a = linear(x, p["wkv_a"], c, mesh=mesh)
    latent = rms_norm(kv_a[..., : c.kv_lora_rank], p["kv_norm"], c.rms_norm_eps)  # [B,T,r]
    k_rope = apply_rope(kv_a[..., None, c.kv_lora_rank :], cos, sin, c.rope_interleave)[:, :, 0]
    scale = softmax_scale(c)
    w_uk = p["wkv_b"][..., : c.qk_nope_head_dim].astype(x.dtype)  # [r, N, nope]
    w_uv = p["wkv_b"][..., c.qk_nope_head_dim :].astype(x.dtype)  # [r, N, v]

    if cache is None:
        kv = linear(latent, p["wkv_b"], c, mesh=mesh)  # [B,T,N,nope+v]
        k = jnp.concatenate(
            [
                kv[..., : c.qk_nope_head_dim],
                jnp.broadcast_to(k_rope[:, :, None], (*kv.shape[:3], c.qk_rope_head_dim)),
            ],
            -1,
        )
        v = kv[..., c.qk_nope_head_dim :]
        q = jnp.concatenate([q_nope, q_rope], -1)
        o = self_attention(q, k, v, segment_ids, scale, c, mesh, "heads")
        return linear(o, p["wo"], c, n_in=2, mesh=mesh), None

    pos = cache["pos"]
    cache = dict(
        cache,
        latent=_write_cache(cache["latent"], latent, pos),
        k_rope=_write_cache(cache["k_rope"], k_rope, pos),
    )
    lat = _visible(cache["latent"], kv_len).astype(x.dtype)
    kr = _visible(cache["k_rope"], kv_len).astype(x.dtype)
    q_lat = einsum_f32("btnd,rnd->btnr", q_nope, w_uk)
    if _cache_blockwise(c, x.shape[1]):
        # MQA in the latent space: one shared key [latent, rope key], value = latent.
        qc = jnp.concatenate([q_lat.astype(x.dtype), q_rope], -1)
        kc = jnp.concatenate([lat, kr], -1)[:, :, None]
        o_lat = _cache_flash(qc, kc, lat[:, :, None], pos, scale, c)
        o = einsum_f32("btnr,rnv->btnv", o_lat, w_uv).astype(x.dtype)
        return linear(o, p["wo"], c, n_in=2, mesh=mesh), cache
    s = (
        einsum_f32("btnr,bsr->bnts", q_lat.astype(x.dtype), lat)
        + einsum_f32("btnd,bsd->bnts", q_rope, kr)
    ) * scale
    mask = _cache_mask(pos, x.shape[1], lat.shape[1])
    s = jnp.where(mask[:, None], s, NEG_INF)
    prob = jax.nn.softmax(s, axis=-1).astype(x.dtype)
    o_lat = einsum_f32("bnts,bsr->bntr", prob, lat).transpose(0, 2, 1, 3)  # see attend
    o = einsum_f32("btnr,rnv->btnv", o_lat.astype(x.dtype), w_uv).astype(x.dtype)
    return linear(o, p["wo"], c, n_in=2, mesh=mesh), cache


# GQA ------------------------------------------------------------------------------------------


def gqa(x, p, c: ModelConfig, positions, segment_ids, mesh: Mesh | None, cache=None, kv_len=None):
    """Grouped-query attention with per-head RMSNorm on q and k (Qwen3); `kv_len` as in `mla`."""
    cos, sin = rope_cos_sin(positions, c)
    q = rms_norm(linear(x, p["wq"], c, mesh=mesh), p["q_norm"], c.rms_norm_eps)
    k = rms_norm(linear(x, p["wk"], c, mesh=mesh), p["k_norm"], c.rms_norm_eps)
    v = linear(x, p["wv"], c, mesh=mesh)
    q = apply_rope(q, cos, sin, interleave=False)
    k = apply_rope(k, cos, sin, interleave=False)
    scale = softmax_scale(c)
    if cache is None:
        o = self_attention(q, k, v, segment_ids, scale, c, mesh, "kv_heads")
        return linear(o, p["wo"], c, n_in=2, mesh=mesh), None
    pos = cache["pos"]
    cache = dict(cache, k=_write_cache(cache["k"], k, pos), v=_write_cache(cache["v"], v, pos))
    ck = _visible(cache["k"], kv_len).astype(x.dtype)
    cv = _visible(cache["v"], kv_len).astype(x.dtype)
    if _cache_blockwise(c, x.shape[1]):
        o = _cache_flash(q, ck, cv, pos, scale, c)
    else:
        o = attend(q, ck, cv, _cache_mask(pos, x.shape[1], ck.shape[1]), scale)
    return linear(o, p["wo"], c, n_in=2, mesh=mesh), cache


def attention(x, p, c: ModelConfig, positions, segment_ids, mesh=None, cache=None, kv_len=None):
    fn = mla if c.is_mla else gqa
    return fn(x, p, c, positions, segment_ids, mesh, cache, kv_len)


def init_layer_cache(c: ModelConfig, n_layers: int, batch: int, max_len: int, dtype) -> dict:
    """Per-layer-group cache arrays, stacked on a leading layer axis."""
    if c.is_mla:
        return {
            "latent": jnp.zeros((n_layers, batch, max_len, c.kv_lora_rank), dtype),
            "k_rope": jnp.zeros((n_layers, batch, max_len, c.qk_rope_head_dim), dtype),
        }
    shape = (n_layers, batch, max_len, c.n_kv_heads, c.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}
