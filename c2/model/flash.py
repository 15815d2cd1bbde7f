"""Blockwise (flash-style) causal attention with segment ids, in plain JAX (every backend).

The scores are never materialised: queries are cut into blocks of `block_q` rows, keys and values
into blocks of `block_kv`, and each query block runs an online softmax over the key blocks
(running max m, running sum l, unnormalised output; FlashAttention-2, arXiv:2307.08691). The
backward pass is a `custom_vjp` that keeps only the output and the log-sum-exp per query row and
recomputes each block's probabilities, so the memory is O(T + S), never O(T * S).

Masking is by values, not by static offsets: query row t may attend key s when their segment ids
are equal and `k_idx[s] <= q_idx[t]` (positions in the global sequence). That lets the same code
serve one device (indices 0..T-1) and ring attention (c2/model/ring.py: the key chunk arriving
from another context shard carries its own indices). A key block that no query of the block can
see (all in the future, or no segment in common) is skipped with `lax.cond`, forward and backward.

A query row that sees no key at all outputs zeros (the dense path would give a uniform average;
causal self-attention always sees itself, so the two agree wherever it matters). Lengths that are
not a multiple of the block are padded inside (the padding never matches a real segment id).

`forward_parts` / `backward_parts` are the two halves, also used by ring attention: the forward
returns float32 output and log-sum-exp, the backward takes the final log-sum-exp and
delta = rowsum(dO * O) and returns float32 gradients of one key chunk's contribution.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from c2.model.layers import einsum_f32

NEG_INF = -1e30  # finite: a fully-masked row keeps finite statistics (no inf - inf = NaN)
_Q_PAD = np.iinfo(np.int32).min + 1  # segment id of padded query rows
_K_PAD = np.iinfo(np.int32).min  # segment id of padded key rows: matches nothing
_IDX_MAX = np.iinfo(np.int32).max  # index of padded key rows: in every query's future


def _pad(x: jax.Array, n: int, value) -> jax.Array:
    """Pad axis 1 of x up to n rows with value."""
    if x.shape[1] == n:
        return x
    width = [(0, 0)] * x.ndim
    width[1] = (0, n - x.shape[1])
    return jnp.pad(x, width, constant_values=value)


def _blocks(n: int, block: int) -> tuple[int, int]:
    """(block size, number of blocks) covering n rows; the block never exceeds n."""
    if block <= 0:
        raise ValueError(f"attention block size must be > 0, got {block}")
    b = min(block, n)
    return b, -(-n // b)


def _split_q(x, nb, bq, Kh):
    """[B, T, N, d] (T = nb * bq) -> [nb, B, Kh, G, bq, d]."""
    B, _, N, d = x.shape
    return x.reshape(B, nb, bq, Kh, N // Kh, d).transpose(1, 0, 3, 4, 2, 5)


def _merge_q(x):
    """[nb, B, Kh, G, bq, d] -> [B, nb * bq, Kh * G, d]."""
    nb, B, Kh, G, bq, d = x.shape
    return x.transpose(1, 0, 4, 2, 3, 5).reshape(B, nb * bq, Kh * G, d)


def _split_k(x, nb, bk):
    """[B, S, Kh, d] -> [nb, B, Kh, bk, d]."""
    B, _, Kh, d = x.shape
    return x.reshape(B, nb, bk, Kh, d).transpose(1, 0, 3, 2, 4)


def _merge_k(x):
    """[nb, B, Kh, bk, d] -> [B, nb * bk, Kh, d]."""
    nb, B, Kh, bk, d = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(B, nb * bk, Kh, d)


def _split_rows(x, nb, b):
    """[B, T] -> [nb, B, b]."""
    return x.reshape(x.shape[0], nb, b).transpose(1, 0, 2)


def _visible(qs, qi, ks, ki):
    """False when no query of the block can see any key of the block (safe to skip)."""
    causal = jnp.min(ki) <= jnp.max(qi)
    overlap = (jnp.min(ks) <= jnp.max(qs)) & (jnp.min(qs) <= jnp.max(ks))
    return causal & overlap


def _mask(qs, qi, ks, ki):
    """[B, 1, 1, bq, bk]: same segment and key not in the future."""
    m = (qs[:, :, None] == ks[:, None, :]) & (ki[:, None, :] <= qi[:, :, None])
    return m[:, None, None]


def _prepare(q, k, v, q_seg, k_seg, q_idx, k_idx, block_q, block_kv):
    B, T, N, d = q.shape
    S, Kh = k.shape[1], k.shape[2]
    if N % Kh:
        raise ValueError(f"{N} query heads are not a multiple of {Kh} key/value heads")
    bq, nq = _blocks(T, block_q)
    bk, nk = _blocks(S, block_kv)
    Tp, Sp = nq * bq, nk * bk
    q_seg, q_idx = jnp.broadcast_to(q_seg, (B, T)), jnp.broadcast_to(q_idx, (B, T))
    k_seg, k_idx = jnp.broadcast_to(k_seg, (B, S)), jnp.broadcast_to(k_idx, (B, S))
    qb = _split_q(_pad(q, Tp, 0), nq, bq, Kh)
    kb = _split_k(_pad(k, Sp, 0), nk, bk)
    vb = _split_k(_pad(v, Sp, 0), nk, bk)
    qsb = _split_rows(_pad(q_seg.astype(jnp.int32), Tp, _Q_PAD), nq, bq)
    qib = _split_rows(_pad(q_idx.astype(jnp.int32), Tp, 0), nq, bq)
    ksb = _split_rows(_pad(k_seg.astype(jnp.int32), Sp, _K_PAD), nk, bk)
    kib = _split_rows(_pad(k_idx.astype(jnp.int32), Sp, _IDX_MAX), nk, bk)
    return (qb, kb, vb, qsb, qib, ksb, kib), (bq, nq, bk, nk)


def forward_parts(q, k, v, q_seg, k_seg, q_idx, k_idx, *, scale, block_q, block_kv):
    """Float32 output [B, T, N, dv] and log-sum-exp [B, T, N] (NEG_INF for rows seeing nothing).

    q [B,T,N,d], k [B,S,Kh,d], v [B,S,Kh,dv]; segment ids and indices [B,T] / [B,S] (broadcast).
    """
    B, T, N, _ = q.shape
    (qb, kb, vb, qsb, qib, ksb, kib), (bq, nq, bk, nk) = _prepare(
        q, k, v, q_seg, k_seg, q_idx, k_idx, block_q, block_kv
    )
    _, _, Kh, G, _, _ = qb.shape
    dv = v.shape[-1]

    def q_block(xs):
        qi, qs, qx = xs  # [B,Kh,G,bq,d], [B,bq], [B,bq]

        def kv_step(j, carry):
            def compute(carry):
                m, l, acc = carry
                ks, kx = ksb[j], kib[j]
                s = einsum_f32("bkgqd,bksd->bkgqs", qi, kb[j]) * scale
                mask = _mask(qs, qx, ks, kx)
                s = jnp.where(mask, s, NEG_INF)
                m_new = jnp.maximum(m, jnp.max(s, -1))
                p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
                corr = jnp.exp(m - m_new)
                l = l * corr + jnp.sum(p, -1)
                pv = einsum_f32("bkgqs,bksd->bkgqd", p.astype(v.dtype), vb[j])
                return m_new, l, acc * corr[..., None] + pv

            vis = _visible(qs, qx, ksb[j], kib[j])
            return jax.lax.cond(vis, compute, lambda c: c, carry)

        init = (
            jnp.full((B, Kh, G, bq), NEG_INF, jnp.float32),
            jnp.zeros((B, Kh, G, bq), jnp.float32),
            jnp.zeros((B, Kh, G, bq, dv), jnp.float32),
        )
        m, l, acc = jax.lax.fori_loop(0, nk, kv_step, init)
        seen = l > 0
        l = jnp.where(seen, l, 1.0)
        return acc / l[..., None], jnp.where(seen, m + jnp.log(l), NEG_INF)

    o, lse = jax.lax.map(q_block, (qb, qsb, qib))  # [nq,B,Kh,G,bq,dv], [nq,B,Kh,G,bq]
    o = _merge_q(o)[:, :T]
    lse = _merge_q(lse[..., None])[:, :T, :, 0]
    return o, lse


def backward_parts(
    q, k, v, q_seg, k_seg, q_idx, k_idx, lse, delta, do, *, scale, block_q, block_kv
):
    """Float32 (dq, dk, dv) of the attention of q over this key chunk, given the final
    log-sum-exp [B,T,N] and delta = rowsum(dO * O) [B,T,N] of the whole attention."""
    B, T, N, d = q.shape
    S = k.shape[1]
    (qb, kb, vb, qsb, qib, ksb, kib), (bq, nq, bk, nk) = _prepare(
        q, k, v, q_seg, k_seg, q_idx, k_idx, block_q, block_kv
    )
    _, _, Kh, G, _, _ = qb.shape
    Tp = nq * bq
    dob = _split_q(_pad(do, Tp, 0), nq, bq, Kh)
    lseb = _split_q(_pad(lse[..., None], Tp, 0), nq, bq, Kh)[..., 0]
    deltab = _split_q(_pad(delta[..., None], Tp, 0), nq, bq, Kh)[..., 0]

    def kv_block(dq, xs):
        kj, vj, ks, kx = xs  # [B,Kh,bk,d], [B,Kh,bk,dv], [B,bk], [B,bk]

        def q_step(i, carry):
            def compute(carry):
                dq, dk, dv = carry
                qi, do_i = qb[i], dob[i]
                s = einsum_f32("bkgqd,bksd->bkgqs", qi, kj) * scale
                mask = _mask(qsb[i], qib[i], ks, kx)
                p = jnp.where(mask, jnp.exp(s - lseb[i][..., None]), 0.0)
                dv = dv + einsum_f32("bkgqs,bkgqd->bksd", p.astype(do.dtype), do_i)
                dp = einsum_f32("bkgqd,bksd->bkgqs", do_i, vj)
                ds = (p * (dp - deltab[i][..., None])).astype(q.dtype)
                dq = dq.at[i].add(einsum_f32("bkgqs,bksd->bkgqd", ds, kj) * scale)
                dk = dk + einsum_f32("bkgqs,bkgqd->bksd", ds, qi) * scale
                return dq, dk, dv

            vis = _visible(qsb[i], qib[i], ks, kx)
            return jax.lax.cond(vis, compute, lambda c: c, carry)

        init = (
            dq,
            jnp.zeros(kj.shape, jnp.float32),
            jnp.zeros(vj.shape, jnp.float32),
        )
        dq, dk, dv = jax.lax.fori_loop(0, nq, q_step, init)
        return dq, (dk, dv)

    dq0 = jnp.zeros(qb.shape, jnp.float32)
    dq, (dk, dv) = jax.lax.scan(kv_block, dq0, (kb, vb, ksb, kib))
    return _merge_q(dq)[:, :T], _merge_k(dk)[:, :S], _merge_k(dv)[:, :S]


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def flash_attention(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q=512, block_kv=512):
    """Causal, segment-masked softmax attention in blocks. q [B,T,N,d], k [B,S,Kh,d],
    v [B,S,Kh,dv] (N a multiple of Kh; dv may differ from d, as in MLA) -> [B,T,N,dv] in q.dtype.
    Query t attends key s iff q_seg[t] == k_seg[s] and k_idx[s] <= q_idx[t]."""
    o, _ = forward_parts(
        q, k, v, q_seg, k_seg, q_idx, k_idx, scale=scale, block_q=block_q, block_kv=block_kv
    )
    return o.astype(q.dtype)


def _flash_fwd(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q, block_kv):
    o, lse = forward_parts(
        q, k, v, q_seg, k_seg, q_idx, k_idx, scale=scale, block_q=block_q, block_kv=block_kv
    )
    o = o.astype(q.dtype)
    return o, (q, k, v, q_seg, k_seg, q_idx, k_idx, o, lse)


def _flash_bwd(scale, block_q, block_kv, res, do):
    q, k, v, q_seg, k_seg, q_idx, k_idx, o, lse = res
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), -1)
    dq, dk, dv = backward_parts(
        q,
        k,
        v,
        q_seg,
        k_seg,
        q_idx,
        k_idx,
        lse,
        delta,
        do,
        scale=scale,
        block_q=block_q,
        block_kv=block_kv,
    )
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


flash_attention.defvjp(_flash_fwd, _flash_bwd)
