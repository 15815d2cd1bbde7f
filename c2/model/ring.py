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

`context_attention` is the entry point: a `shard_map` over the whole mesh laid out by the
layout's rules (by default batch over the data axes, sequence over `context`, heads over
`tensor`; the ring runs over the mesh axes of `seq`), the blockwise kernel alone when those have
size 1.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from c2 import sharding
from c2.model import flash


def _shift(xs, axis_name: str | tuple[str, ...], n: int):
    """Send every array to the next shard on the ring (shard i -> i + 1)."""
    perm = [(i, (i + 1) % n) for i in range(n)]
    return jax.tree.map(lambda x: jax.lax.ppermute(x, axis_name, perm), xs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9, 10, 11))
def ring_attention(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q, block_kv, axis_name, n):
    """Inside shard_map: this shard's queries over every shard's keys. Local shapes as in
    flash.flash_attention; q_idx / k_idx are global positions. Returns [B,T,N,dv] in q.dtype."""
    return _ring_fwd(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q, block_kv, axis_name, n)[0]


def _ring_fwd(q, k, v, q_seg, k_seg, q_idx, k_idx, scale, block_q, block_kv, axis_name, n):
    qp = flash.prepare_q(q, q_seg, q_idx, k.shape[2], block_q)
    kvp = flash.prepare_kv(k, v, k_seg, k_idx, block_kv)  # travels in block layout

    def hop(_, carry):
        kvp, state = carry
        nxt = _shift(kvp, axis_name, n)  # in flight while this chunk is computed
        return nxt, flash.forward_blocks(state, qp, kvp, scale)

    # n hops: the last one brings every chunk home (unused; it overlaps the last compute).
    _, state = flash.block_loop(n, hop, (kvp, flash.init_state(qp, v.shape[-1])))
    o, lse = flash.finish_state(state)
    out = flash.merge_q(o, q.shape[1]).astype(q.dtype)
    return out, (q, k, v, q_seg, k_seg, q_idx, k_idx, out, lse)


def _ring_bwd(scale, block_q, block_kv, axis_name, n, res, do):
    q, k, v, q_seg, k_seg, q_idx, k_idx, out, lse = res
    qp, kvp, dob, lseb, deltab = flash._residual_blocks(
        q, k, v, q_seg, k_seg, q_idx, k_idx, out, lse, do, block_q, block_kv
    )

    def hop(_, carry):
        kvp, (dq, dk, dv) = carry
        nxt = _shift(kvp, axis_name, n)
        dq, dk, dv = flash.backward_blocks((dq, dk, dv), qp, dob, lseb, deltab, kvp, scale)
        # A chunk's gradient follows the chunk; after the n-th hop both are home again.
        dk, dv = _shift((dk, dv), axis_name, n)
        return nxt, (dq, dk, dv)

    _, (dq, dk, dv) = flash.block_loop(n, hop, (kvp, flash.zero_grads(qp, kvp)))
    T, S = q.shape[1], k.shape[1]
    return (
        flash.merge_q(dq, T).astype(q.dtype),
        flash.merge_kv(dk, S).astype(k.dtype),
        flash.merge_kv(dv, S).astype(v.dtype),
        None,
        None,
        None,
        None,
    )


ring_attention.defvjp(_ring_fwd, _ring_bwd)


def context_attention(
    q,
    k,
    v,
    segment_ids,
    *,
    scale: float,
    mesh: Mesh | sharding.Layout | None,
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
    layout = sharding.as_layout(mesh)
    if layout is None or layout.mesh.size == 1:
        return flash.flash_attention(
            q, k, v, segment_ids, segment_ids, idx, idx, scale, block_q, block_kv
        )
    ring = sharding.axes_of(layout, "seq")  # the shards of the sequence
    n = sharding.axis_size(layout, ring)
    q_spec = sharding.logical_to_spec(("batch", "seq", "heads", None), layout.rules)
    kv_spec = sharding.logical_to_spec(("batch", "seq", kv_heads, None), layout.rules)
    row_spec = sharding.logical_to_spec(("batch", "seq"), layout.rules)

    def body(q, k, v, seg, idx):
        if n == 1:
            return flash.flash_attention(q, k, v, seg, seg, idx, idx, scale, block_q, block_kv)
        return ring_attention(q, k, v, seg, seg, idx, idx, scale, block_q, block_kv, ring, n)

    fn = jax.shard_map(
        body,
        mesh=layout.mesh,
        in_specs=(q_spec, kv_spec, kv_spec, row_spec, row_spec),
        out_specs=q_spec,
        check_vma=False,
    )
    return fn(q, k, v, segment_ids, idx)
