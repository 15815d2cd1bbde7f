"""Ring attention over the `context` mesh axis (context parallelism without gathering K/V).

Each context shard holds a contiguous chunk of the sequence: its queries, keys, values, segment
ids and global positions. The key chunks travel around the ring with `ppermute` (n - 1 hops); at
each hop a shard attends its queries to the chunk it holds with the blockwise kernel
(c2/model/flash.py) and folds the partial result into a running (output, log-sum-exp) pair with
the online-softmax rule. The next chunk's `ppermute` is issued before the current chunk's compute,
so the transfer can overlap it. Segment ids and positions travel with the keys, so packed
documents and the causal mask need nothing else; chunks entirely in a shard's future are skipped
block by block (`lax.cond`), which leaves the work unbalanced: shard i computes i + 1 chunks
(no zig-zag load balancing yet).

The backward is a `custom_vjp` that recomputes: the key chunks go around again, each shard adds
its queries' dq and the chunk's dk/dv, and the dk/dv accumulators travel with their chunk, one
extra hop bringing them home. Memory per shard is O(T / n) plus the blockwise kernel's blocks.

`context_attention` is the entry point: a `shard_map` over the whole mesh (batch over the data
axes, sequence over `context`, heads over `tensor`), the blockwise kernel alone when the context
axis has size 1.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from c2 import sharding
from c2.model import flash


def _combine(o, lse, o_s, lse_s):
    """Merge two softmax-normalised partial outputs by their log-sum-exps."""
    new = jnp.logaddexp(lse, lse_s)
    return o * jnp.exp(lse - new)[..., None] + o_s * jnp.exp(lse_s - new)[..., None], new


def _shift(xs, axis_name: str, n: int):
    """Send every array to the next shard on the ring (shard i -> i + 1)."""
    perm = [(i, (i + 1) % n) for i in range(n)]
    return jax.tree.map(lambda x: jax.lax.ppermute(x, axis_name, perm), xs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11))
def ring_attention(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q, block_kv, axis_name, n):
    """Inside shard_map: this shard's queries over every shard's keys. Local shapes as in
    flash.flash_attention; q_idx / k_idx are global positions. Returns [B,T,N,dv] in q.dtype."""
    return _ring_fwd(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q, block_kv, axis_name, n)[0]


def _ring_fwd(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q, block_kv, axis_name, n):
    kw = dict(scale=scale, block_q=block_q, block_kv=block_kv)
    chunk = (k, v, k_seg, k_idx)
    o = lse = None
    for step in range(n):
        nxt = _shift(chunk, axis_name, n) if step < n - 1 else None  # in flight during compute
        o_s, lse_s = flash.forward_parts(
            q, chunk[0], chunk[1], q_seg, chunk[2], q_idx, chunk[3], **kw
        )
        o, lse = (o_s, lse_s) if o is None else _combine(o, lse, o_s, lse_s)
        chunk = nxt
    out = o.astype(q.dtype)
    return out, (q, k, v, q_seg, k_seg, q_idx, k_idx, out, lse)


def _ring_bwd(scale, block_q, block_kv, axis_name, n, res, do):
    q, k, v, q_seg, k_seg, q_idx, k_idx, out, lse = res
    kw = dict(scale=scale, block_q=block_q, block_kv=block_kv)
    delta = jnp.sum(do.astype(jnp.float32) * out.astype(jnp.float32), -1)
    chunk = (k, v, k_seg, k_idx)
    dq = jnp.zeros(q.shape, jnp.float32)
    dk = jnp.zeros(k.shape, jnp.float32)
    dv = jnp.zeros(v.shape, jnp.float32)
    for step in range(n):
        nxt = _shift(chunk, axis_name, n) if step < n - 1 else None
        dq_s, dk_s, dv_s = flash.backward_parts(
            q, chunk[0], chunk[1], q_seg, chunk[2], q_idx, chunk[3], lse, delta, do, **kw
        )
        dq, dk, dv = dq + dq_s, dk + dk_s, dv + dv_s
        # The chunk's gradient follows the chunk; after the last hop one more brings it home.
        dk, dv = _shift((dk, dv), axis_name, n)
        chunk = nxt
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None, None, None


ring_attention.defvjp(_ring_fwd, _ring_bwd)


def context_attention(
    q,
    k,
    v,
    segment_ids,
    *,
    scale: float,
    mesh: Mesh | None,
    kv_heads: str = "heads",
    block_q: int = 512,
    block_kv: int = 512,
):
    """Causal self-attention of a packed batch in blocks: q [B,T,N,d], k [B,T,Kh,d],
    v [B,T,Kh,dv], segment_ids [B,T] -> [B,T,N,dv]. With a mesh: batch over the data axes,
    sequence over `context` (ring attention), heads over `tensor` (`kv_heads` names the logical
    axis of k/v's heads: "heads" for MLA, "kv_heads" for GQA)."""
    B, T = segment_ids.shape
    idx = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    if mesh is None or mesh.size == 1:
        return flash.flash_attention(
            q, k, v, segment_ids, segment_ids, idx, idx, scale, block_q, block_kv
        )
    n = sharding.axis_size(mesh, "context")
    q_spec = sharding.logical_to_spec(("batch", "seq", "heads", None))
    kv_spec = sharding.logical_to_spec(("batch", "seq", kv_heads, None))
    row_spec = sharding.logical_to_spec(("batch", "seq"))

    def body(q, k, v, seg, idx):
        if n == 1:
            return flash.flash_attention(q, k, v, seg, seg, idx, idx, scale, block_q, block_kv)
        return ring_attention(q, k, v, seg, seg, idx, idx, scale, block_q, block_kv, "context", n)

    fn = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(q_spec, kv_spec, kv_spec, row_spec, row_spec),
        out_specs=q_spec,
        check_vma=False,
    )
    return fn(q, k, v, segment_ids, idx)
