"""Blockwise (flash-style) causal attention with segment ids, in plain JAX (every backend).

The scores are never materialised: queries are cut into blocks of `block_q` rows, keys and values
into blocks of `block_kv`, and each query block runs an online softmax over the key blocks
(running max m, running sum l, unnormalised output; FlashAttention-2, arXiv:2307.08691). The
backward pass is a `custom_vjp` that keeps only the output and the log-sum-exp per query row and
recomputes each block's probabilities, so the memory is O(T + S), never O(T * S).

Masking is by values, not by static offsets: query row t may attend key s when their segment ids
match (`segments_match`: equal, or the key in the query's trunk) and `k_idx[s] <= q_idx[t]`
(positions in the global sequence). That lets the same code serve one device (indices 0..T-1)
and ring attention (c2/model/ring.py: the key chunk arriving from another context shard carries
its own indices). A key block that no query of the block can see (all in the future, or no
segment in common) is skipped with `lax.cond`, forward and backward.

A query row that sees no key at all outputs zeros (the dense path would give a uniform average;
causal self-attention always sees itself, so the two agree wherever it matters). Lengths that are
not a multiple of the block are padded inside (the padding never matches a real segment id).

The pieces are public for ring attention (c2/model/ring.py): `prepare_q` / `prepare_kv` put the
inputs in block layout once; `forward_blocks` folds a key chunk into a running online-softmax
state (`init_state`, `finish_state`), so the chunks arriving around the ring continue one softmax;
`backward_blocks` adds a key chunk's share to float32 (dq, dk, dv) accumulators, given the final
log-sum-exp and delta = rowsum(dO * O). `forward_parts` is the whole forward on one device.
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

# Segment ids >= BRANCH_STRIDE are branches: segment `d + b * BRANCH_STRIDE` (b >= 1) is branch b of
# document d, and sees its own tokens and those of segment d, the trunk its branches share (one
# prompt and its samples, packed once: c2.rl.batching). Ids below it are plain documents.
BRANCH_STRIDE = 1 << 20


def trunk_of(seg: jax.Array) -> jax.Array:
    """The segment a segment's tokens see besides their own: a branch's trunk, else itself."""
    return jnp.where(seg >= BRANCH_STRIDE, seg % BRANCH_STRIDE, seg)


def segments_match(q_seg: jax.Array, k_seg: jax.Array) -> jax.Array:
    """Whether a query of segment q_seg may see a key of segment k_seg (broadcasting): the same
    segment, or the key in the query's trunk."""
    return (q_seg == k_seg) | (k_seg == trunk_of(q_seg))


def _pad(x: jax.Array, n: int, value) -> jax.Array:
    """Pad axis 1 of x up to n rows with value."""
    if x.shape[1] == n:
        return x
    width = [(0, 0)] * x.ndim
    width[1] = (0, n - x.shape[1])
    return jnp.pad(x, width, constant_values=value)


def block_loop(n: int, body, init):
    """`body(i, carry)` for i = 0 .. n-1, as a `while_loop`, never a `scan`.

    `lax.fori_loop` with static bounds lowers to a scan. When the model's layer stack (itself a
    `lax.scan`) is differentiated, the outer scan's partial evaluation reaches through this
    module's custom_vjp into such inner scans and keeps every iteration's intermediates as
    residuals: each (query block, key block) pair's scores and mask, stacked, i.e. the whole
    [T, S] score matrix this module exists to avoid (549 GB per device for Kimi-K2 at 32k
    tokens; `python -m c2.bench.plan`). A while loop is never partially evaluated (nor
    differentiated: these loops only run inside the custom_vjp's forward and backward), so the
    only residuals are the custom_vjp's own (q, k, v, output, log-sum-exp)."""

    def cond(carry):
        return carry[0] < n

    def step(carry):
        i, value = carry
        return i + 1, body(i, value)

    return jax.lax.while_loop(cond, step, (jnp.int32(0), init))[1]


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
    lo, hi = jnp.min(ks), jnp.max(ks)
    trunks = trunk_of(qs)
    overlap = (lo <= jnp.max(qs)) & (jnp.min(qs) <= hi)
    overlap |= (lo <= jnp.max(trunks)) & (jnp.min(trunks) <= hi)
    return causal & overlap


def _mask(qs, qi, ks, ki):
    """[B, 1, 1, bq, bk]: segments match and key not in the future."""
    m = segments_match(qs[:, :, None], ks[:, None, :]) & (ki[:, None, :] <= qi[:, :, None])
    return m[:, None, None]


def prepare_q(q, q_seg, q_idx, Kh: int, block_q: int):
    """Queries in block layout: (qb [nq,B,Kh,G,bq,d], segment ids, indices [nq,B,bq])."""
    B, T, N, _ = q.shape
    if N % Kh:
        raise ValueError(f"{N} query heads are not a multiple of {Kh} key/value heads")
    bq, nq = _blocks(T, block_q)
    Tp = nq * bq
    q_seg, q_idx = jnp.broadcast_to(q_seg, (B, T)), jnp.broadcast_to(q_idx, (B, T))
    return (
        _split_q(_pad(q, Tp, 0), nq, bq, Kh),
        _split_rows(_pad(q_seg.astype(jnp.int32), Tp, _Q_PAD), nq, bq),
        _split_rows(_pad(q_idx.astype(jnp.int32), Tp, 0), nq, bq),
    )


def prepare_kv(k, v, k_seg, k_idx, block_kv: int):
    """Keys and values in block layout: (kb [nk,B,Kh,bk,d], vb, segment ids, indices)."""
    B, S = k.shape[:2]
    bk, nk = _blocks(S, block_kv)
    Sp = nk * bk
    k_seg, k_idx = jnp.broadcast_to(k_seg, (B, S)), jnp.broadcast_to(k_idx, (B, S))
    return (
        _split_k(_pad(k, Sp, 0), nk, bk),
        _split_k(_pad(v, Sp, 0), nk, bk),
        _split_rows(_pad(k_seg.astype(jnp.int32), Sp, _K_PAD), nk, bk),
        _split_rows(_pad(k_idx.astype(jnp.int32), Sp, _IDX_MAX), nk, bk),
    )


def split_rows_like(x, qp):
    """[B, T, N, e] (output-like) -> the block layout of prepared queries qp."""
    qb = qp[0]
    nq, _, Kh, _, bq, _ = qb.shape
    return _split_q(_pad(x, nq * bq, 0), nq, bq, Kh)


def init_state(qp, dv: int):
    """Online-softmax state (running max, running sum, unnormalised output), float32."""
    shape = qp[0].shape[:-1]
    return (
        jnp.full(shape, NEG_INF, jnp.float32),
        jnp.zeros(shape, jnp.float32),
        jnp.zeros((*shape, dv), jnp.float32),
    )


def forward_blocks(state, qp, kvp, scale: float):
    """Fold every key block of kvp into the online-softmax state of every query block of qp."""
    qb, qsb, qib = qp
    kb, vb, ksb, kib = kvp

    def q_step(i, state):
        qi, qs, qx = qb[i], qsb[i], qib[i]

        def kv_step(j, carry):
            def compute(carry):
                m, l, acc = carry
                s = einsum_f32("bkgqd,bksd->bkgqs", qi, kb[j]) * scale
                mask = _mask(qs, qx, ksb[j], kib[j])
                s = jnp.where(mask, s, NEG_INF)
                m_new = jnp.maximum(m, jnp.max(s, -1))
                p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
                corr = jnp.exp(m - m_new)
                l = l * corr + jnp.sum(p, -1)
                pv = einsum_f32("bkgqs,bksd->bkgqd", p.astype(vb.dtype), vb[j])
                return m_new, l, acc * corr[..., None] + pv

            vis = _visible(qs, qx, ksb[j], kib[j])
            return jax.lax.cond(vis, compute, lambda c: c, carry)

        row = block_loop(kb.shape[0], kv_step, tuple(x[i] for x in state))
        return tuple(x.at[i].set(r) for x, r in zip(state, row))

    return block_loop(qb.shape[0], q_step, state)


def finish_state(state):
    """(normalised float32 output, log-sum-exp), block layout; rows that saw nothing: 0, NEG_INF."""
    m, l, acc = state
    seen = l > 0
    l = jnp.where(seen, l, 1.0)
    return acc / l[..., None], jnp.where(seen, m + jnp.log(l), NEG_INF)


def backward_blocks(grads, qp, dob, lseb, deltab, kvp, scale: float):
    """Add this key chunk's share to grads = (dq [like qb], dk [like kb], dv [like vb]), float32,
    given the final log-sum-exp and delta = rowsum(dO * O) in the queries' block layout."""
    qb, qsb, qib = qp
    kb, vb, ksb, kib = kvp

    def kv_step(j, grads):
        dq, dk, dv = grads
        kj, vj, ks, kx = kb[j], vb[j], ksb[j], kib[j]

        def q_step(i, carry):
            def compute(carry):
                dq, dk_j, dv_j = carry
                qi, do_i = qb[i], dob[i]
                s = einsum_f32("bkgqd,bksd->bkgqs", qi, kj) * scale
                mask = _mask(qsb[i], qib[i], ks, kx)
                p = jnp.where(mask, jnp.exp(s - lseb[i][..., None]), 0.0)
                dv_j = dv_j + einsum_f32("bkgqs,bkgqd->bksd", p.astype(dob.dtype), do_i)
                dp = einsum_f32("bkgqd,bksd->bkgqs", do_i, vj)
                ds = (p * (dp - deltab[i][..., None])).astype(qb.dtype)
                dq = dq.at[i].add(einsum_f32("bkgqs,bksd->bkgqd", ds, kj) * scale)
                dk_j = dk_j + einsum_f32("bkgqs,bkgqd->bksd", ds, qi) * scale
                return dq, dk_j, dv_j

            vis = _visible(qsb[i], qib[i], ks, kx)
            return jax.lax.cond(vis, compute, lambda c: c, carry)

        dq, dk_j, dv_j = block_loop(qb.shape[0], q_step, (dq, dk[j], dv[j]))
        return dq, dk.at[j].set(dk_j), dv.at[j].set(dv_j)

    return block_loop(kb.shape[0], kv_step, grads)


def zero_grads(qp, kvp):
    return tuple(jnp.zeros(x.shape, jnp.float32) for x in (qp[0], kvp[0], kvp[1]))


def merge_q(x, T: int):
    """Block layout [nq,B,Kh,G,bq,e] -> [B, T, N, e] (padding dropped)."""
    return _merge_q(x)[:, :T]


def merge_kv(x, S: int):
    """Block layout [nk,B,Kh,bk,e] -> [B, S, Kh, e] (padding dropped)."""
    return _merge_k(x)[:, :S]


def forward_parts(q, k, v, q_seg, k_seg, q_idx, k_idx, *, scale, block_q, block_kv):
    """Float32 output [B, T, N, dv] and log-sum-exp [B, T, N] (NEG_INF for rows seeing nothing).

    q [B,T,N,d], k [B,S,Kh,d], v [B,S,Kh,dv]; segment ids and indices [B,T] / [B,S] (broadcast).
    """
    T = q.shape[1]
    qp = prepare_q(q, q_seg, q_idx, k.shape[2], block_q)
    kvp = prepare_kv(k, v, k_seg, k_idx, block_kv)
    o, lse = finish_state(forward_blocks(init_state(qp, v.shape[-1]), qp, kvp, scale))
    return merge_q(o, T), merge_q(lse[..., None], T)[..., 0]


def _residual_blocks(q, k, v, q_seg, k_seg, q_idx, k_idx, out, lse, do, block_q, block_kv):
    """Everything the backward needs, in block layout (recomputed from the residuals)."""
    qp = prepare_q(q, q_seg, q_idx, k.shape[2], block_q)
    kvp = prepare_kv(k, v, k_seg, k_idx, block_kv)
    dob = split_rows_like(do.astype(q.dtype), qp)
    deltab = jnp.sum(dob.astype(jnp.float32) * split_rows_like(out, qp).astype(jnp.float32), -1)
    return qp, kvp, dob, lse, deltab


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def flash_attention(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q=512, block_kv=512):
    """Causal, segment-masked softmax attention in blocks. q [B,T,N,d], k [B,S,Kh,d],
    v [B,S,Kh,dv] (N a multiple of Kh; dv may differ from d, as in MLA) -> [B,T,N,dv] in q.dtype.
    Query t attends key s iff segments_match(q_seg[t], k_seg[s]) and k_idx[s] <= q_idx[t]."""
    return _flash_fwd(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q, block_kv)[0]


def _flash_fwd(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q, block_kv):
    qp = prepare_q(q, q_seg, q_idx, k.shape[2], block_q)
    kvp = prepare_kv(k, v, k_seg, k_idx, block_kv)
    o, lse = finish_state(forward_blocks(init_state(qp, v.shape[-1]), qp, kvp, scale))
    out = merge_q(o, q.shape[1]).astype(q.dtype)
    return out, (q, k, v, q_seg, k_seg, q_idx, k_idx, out, lse)


def _flash_bwd(scale, block_q, block_kv, res, do):
    q, k, v, q_seg, k_seg, q_idx, k_idx, out, lse = res
    qp, kvp, dob, lseb, deltab = _residual_blocks(
        q, k, v, q_seg, k_seg, q_idx, k_idx, out, lse, do, block_q, block_kv
    )
    dq, dk, dv = backward_blocks(zero_grads(qp, kvp), qp, dob, lseb, deltab, kvp, scale)
    T, S = q.shape[1], k.shape[1]
    return (
        merge_q(dq, T).astype(q.dtype),
        merge_kv(dk, S).astype(k.dtype),
        merge_kv(dv, S).astype(v.dtype),
        None,
        None,
        None,
        None,
    )


flash_attention.defvjp(_flash_fwd, _flash_bwd)
