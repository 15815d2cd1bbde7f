"""Mixture of experts: router (with router replay), dropless dispatch, expert parallelism.

Router: DeepSeek-V3 sigmoid scores with a bias-corrected, group-limited top-k, or Qwen3 softmax
top-k. `routing` (expert indices [T, k]) forces the selection (router replay); gates are still
gathered from the live, unmasked scores so the router gets gradients.
Dispatch: tokens sorted by expert, grouped matmuls (`jax.lax.ragged_dot`, or each expert's rows
padded to whole tiles where a tiled kernel runs them: the CPU, the grouped Pallas MXFP8 kernels),
scattered back and weighted by gates. With an `expert` mesh axis > 1 the experts are sharded and
tokens travel by an all-to-all inside `jax.shard_map` (ragged where the backend has it, padded
on XLA:CPU). `router_impl="pallas"` computes gates with the router-replay kernel, and the sorted
order too where the local dispatch uses it (the expert-parallel and dense paths sort their own).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from c2 import sharding
from c2.model.config import ModelConfig
from c2.model.grouped import (  # noqa: F401  (the grouped matmuls, importable from here too)
    CPU_TILE,
    KERNEL_TILE,
    _cpu_tiled_rows,
    _ragged,
    _tiled_grouped_mlp,
    grouped_mlp,
    take_rows,
)
from c2.model.layers import einsum_f32, mlp
from c2.quant import target

# Router ---------------------------------------------------------------------------------------


def router_logits(x_TH: jax.Array, p: dict) -> jax.Array:
    """Router logits, float32 [T, E]."""
    return jnp.dot(x_TH.astype(jnp.float32), p["router"].astype(jnp.float32))


def _score(logits_TE: jax.Array, c: ModelConfig) -> jax.Array:
    return jax.nn.sigmoid(logits_TE) if c.score_func == "sigmoid" else jax.nn.softmax(logits_TE, -1)


def router_scores(x_TH: jax.Array, p: dict, c: ModelConfig) -> jax.Array:
    """Score function of the router logits, float32 [T, E]."""
    return _score(router_logits(x_TH, p), c)


def select_experts(scores_TE: jax.Array, bias_E: jax.Array | None, c: ModelConfig) -> jax.Array:
    """Live top-k expert indices [T, k]; group-limited on bias-corrected scores (DeepSeek-V3)."""
    s = jax.lax.stop_gradient(scores_TE)
    if bias_E is not None:
        s = s + bias_E.astype(jnp.float32)
    if c.n_group > 1:
        T, E = s.shape
        grouped = s.reshape(T, c.n_group, E // c.n_group)
        group_score = jax.lax.top_k(grouped, 2)[0].sum(-1)  # [T, n_group]
        _, top_groups = jax.lax.top_k(group_score, c.topk_group)
        keep = jnp.zeros((T, c.n_group), bool).at[jnp.arange(T)[:, None], top_groups].set(True)
        s = jnp.where(jnp.repeat(keep, E // c.n_group, axis=1), s, -jnp.inf)
    return jax.lax.top_k(s, c.n_experts_per_token)[1].astype(jnp.int32)


def gate_weights(scores_TE: jax.Array, idx_TK: jax.Array, c: ModelConfig) -> jax.Array:
    """Scores gathered at the chosen experts, optionally renormalised, times the routed scale."""
    g = jnp.take_along_axis(scores_TE, idx_TK, axis=-1)
    if c.norm_topk_prob:
        eps = 1e-20 if c.score_func == "sigmoid" else 0.0
        g = g / (g.sum(-1, keepdims=True) + eps)
    return g * c.routed_scaling_factor


def route(x_TH, p, c: ModelConfig, routing_TK=None, *, sorted_pairs: bool = True, mesh=None):
    """(indices [T,k] int32, gates [T,k] float32, scores [T,E] float32, sorted pairs or None).

    With `router_impl="pallas"` the router-replay kernel (pallas_kernels/router_replay.py) gathers
    the gates from the logits and, when `sorted_pairs`, also returns the expert-sorted order of the
    (token, slot) pairs and the per-expert counts, which the local dispatch reuses instead of
    sorting again. Callers that sort elsewhere pass `sorted_pairs=False`: gates only.
    """
    logits = router_logits(x_TH, p)
    scores = _score(logits, c)
    if routing_TK is None:  # top_k has no partitioning rule either: gathered outside shard_map
        bias = p.get("router_bias")
        select = sharding.per_device_tokens(
            lambda s: (select_experts(s, bias, c),), mesh, (True,), 1
        )
        idx = select(scores)[0]
    else:
        idx = routing_TK
    idx = idx.astype(jnp.int32)
    if c.router_impl == "pallas":
        from pallas_kernels.router_replay import router_replay, router_replay_gates

        kw = dict(
            score_func=c.score_func,
            norm_topk_prob=c.norm_topk_prob,
            routed_scaling_factor=c.routed_scaling_factor,
        )
        if not sorted_pairs:
            gates_fn = sharding.per_device_tokens(
                lambda lg, i: (router_replay_gates(lg, i, **kw),), mesh, (True, True), 1
            )
            return idx, gates_fn(logits, idx)[0], scores, None
        pairs = router_replay(logits, idx, **kw)
        return idx, pairs.gates_TK, scores, pairs
    return idx, gate_weights(scores, idx, c), scores, None


def balance_loss(scores_TE, idx_TK, c: ModelConfig, valid_T) -> jax.Array:
    """Switch-style load-balance loss E * sum_e f_e * P_e over valid tokens."""
    E, K = c.n_experts, c.n_experts_per_token
    w = valid_T.astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    frac = (jax.nn.one_hot(idx_TK, E).sum(1) * w[:, None]).sum(0) / (n * K)
    probs = scores_TE / scores_TE.sum(-1, keepdims=True)
    mean_prob = (probs * w[:, None]).sum(0) / n
    return E * jnp.sum(jax.lax.stop_gradient(frac) * mean_prob)


def _all_experts_local(x_TH, idx_TK, gates_TK, p, c: ModelConfig):
    """Every expert on every token, then each token's chosen experts taken and combined as in
    `_dispatch_local`: the same per-row products and the same combine. On the CPU at a few
    tokens (a decode step: T*E rows where the tiles would compute ~E*CPU_TILE) this is the
    cheaper layout, and it needs no sort, gather or scatter."""
    dtype = jnp.dtype(c.dtype)
    x = x_TH.astype(dtype)

    def mm(spec, a, w):
        return einsum_f32(spec, a, w.astype(dtype)).astype(dtype)

    # Batched over experts, x broadcast ([E, T, H] is smaller than the weights at a few tokens):
    # "th,ehi" would transpose (copy) every expert's weights on each call.
    xe = jnp.broadcast_to(x, (p["w_gate"].shape[0], *x.shape))
    h = jax.nn.silu(mm("eth,ehi->eti", xe, p["w_gate"])) * mm("eth,ehi->eti", xe, p["w_up"])
    y_ETH = mm("eti,eih->eth", h, p["w_down"])
    y_TKH = y_ETH[idx_TK, jnp.arange(x.shape[0])[:, None]]
    return einsum_f32("tkh,tk->th", y_TKH, gates_TK.astype(y_TKH.dtype))


def _capacity_local(x_TH, idx_TK, gates_TK, p, c: ModelConfig, capacity: int):
    """Each expert's rows in its own `capacity` slots ([E, capacity, H], in token order; the
    busiest expert must fit), one batched matmul per projection with every expert's weights in
    place, each (token, slot) pair's output taken back and combined as in `_dispatch_local`."""
    T, K = idx_TK.shape
    E = p["w_gate"].shape[0]
    dtype = jnp.dtype(c.dtype)
    flat = idx_TK.reshape(-1)
    one_hot = (flat[:, None] == jnp.arange(E)[None]).astype(jnp.int32)
    rank = (jnp.cumsum(one_hot, 0) * one_hot).sum(-1) - 1  # the pair's place in its expert
    slot = flat * capacity + rank
    pair = (
        jnp.full((E * capacity,), T * K, jnp.int32)
        .at[slot]
        .set(jnp.arange(T * K, dtype=jnp.int32), mode="drop")
    )
    xe = x_TH.astype(dtype).at[pair // K].get(mode="fill", fill_value=0)
    xe = xe.reshape(E, capacity, -1)

    def mm(spec, a, w):
        return einsum_f32(spec, a, w.astype(dtype)).astype(dtype)

    h = jax.nn.silu(mm("ech,ehi->eci", xe, p["w_gate"])) * mm("ech,ehi->eci", xe, p["w_up"])
    y = mm("eci,eih->ech", h, p["w_down"]).reshape(E * capacity, -1)
    y_TKH = y[slot].reshape(T, K, -1)
    return einsum_f32("tkh,tk->th", y_TKH, gates_TK.astype(y_TKH.dtype))


def decode_capacity(T: int, K: int, E: int) -> int | None:
    """The per-expert slots a CPU step over T tokens tries before every expert on every token:
    three times the mean load, when below T (None: no such). A decode step's routing is skewed:
    32 tokens x top-4 of 16 experts put ~19 on the busiest, the mean being 8, so twice the mean
    (what this was before) rarely fit and every expert ran on every token."""
    cap = 3 * -(-T * K // E)
    return cap if cap < T else None


def _few_tokens_local(x_TH, idx_TK, gates_TK, p, c: ModelConfig):
    """A few tokens (a decode step) on the CPU: `decode_capacity` slots per expert when the
    busiest expert fits (E * capacity rows where every expert on every token is E * T), else
    every expert on every token; chosen on the device per call, the same values either way."""
    T, K = idx_TK.shape
    E = p["w_gate"].shape[0]
    cap = decode_capacity(T, K, E)
    if cap is None:
        return _all_experts_local(x_TH, idx_TK, gates_TK, p, c)
    busiest = jnp.bincount(idx_TK.reshape(-1), length=E).max()
    return jax.lax.cond(
        busiest <= cap,
        functools.partial(_capacity_local, c=c, capacity=cap),
        functools.partial(_all_experts_local, c=c),
        x_TH,
        idx_TK,
        gates_TK,
        p,
    )


def _dispatch_local(x_TH, idx_TK, gates_TK, p, c: ModelConfig, pairs=None):
    """Dropless: sort (token, slot) pairs by expert, grouped matmuls, unsort, weight by gates.

    `pairs` (from the router-replay kernel) carries the sorted order, its inverse and the counts.
    """
    T, K = idx_TK.shape
    E = p["w_gate"].shape[0]
    all_experts_rows, tiled_rows = T * E, _cpu_tiled_rows(T * K, E)
    few_tokens = all_experts_rows <= tiled_rows
    if target.backend() == "cpu" and c.quant != "mxfp8" and few_tokens:
        # Few tokens (decoding): every expert on every token is fewer rows than whole tiles.
        return _few_tokens_local(x_TH, idx_TK, gates_TK, p, c)
    if pairs is None:
        flat = idx_TK.reshape(-1)
        order = jnp.argsort(flat, stable=True)
        unsort = jnp.zeros_like(order).at[order].set(jnp.arange(T * K, dtype=order.dtype))
        sizes = jnp.bincount(flat, length=p["w_gate"].shape[0]).astype(jnp.int32)
    else:
        order, unsort, sizes = pairs.sort_idx, pairs.unsort_idx, pairs.counts_E
    # Each token's row once per slot, then permutations by gathers both ways (take_rows): the
    # gradient of x[order // K] would be a scatter-add.
    x_NH = jnp.broadcast_to(x_TH[:, None], (T, K, x_TH.shape[-1])).reshape(T * K, -1)
    y = grouped_mlp(take_rows(x_NH, order, unsort), p, sizes, c)
    y_TKH = take_rows(y, unsort, order).reshape(T, K, -1)
    return einsum_f32("tkh,tk->th", y_TKH, gates_TK.astype(y.dtype))


def _dispatch_dense(x_TH, idx_TK, gates_TK, p, c: ModelConfig):
    """Every expert on every token, combined by a [T, E] gate matrix (tiny CPU runs only)."""
    T = x_TH.shape[0]
    combine = (
        jnp.zeros((T, c.n_experts), jnp.float32).at[jnp.arange(T)[:, None], idx_TK].add(gates_TK)
    )
    dtype = jnp.dtype(c.dtype)
    x = x_TH.astype(dtype)
    h = jax.nn.silu(einsum_f32("th,ehi->tei", x, p["w_gate"].astype(dtype)))
    h = h * jnp.einsum("th,ehi->tei", x, p["w_up"].astype(dtype))
    y = jnp.einsum("tei,eih->teh", h, p["w_down"].astype(dtype))
    return jnp.einsum("teh,te->th", y, combine.astype(dtype))


# Dropless exchange buffers: each (source, destination) pair sends at most `capacity` rows per
# round, capacity = DROPLESS_BUFFER_FACTOR x the balanced load (N / ep); rows beyond it travel in
# further rounds, taken only when some pair overflows (bounded: at most ceil(N / capacity)).
DROPLESS_BUFFER_FACTOR = 1.25


def exchange_capacity(c: ModelConfig, n_rows: int, ep: int) -> int:
    """Rows per (source, destination) pair per exchange round, for n_rows = T * K local rows.

    `expert_capacity_factor` (a cap: rows past it are dropped and counted) or, dropless, the
    DROPLESS_BUFFER_FACTOR; never more than the worst case n_rows. A device receives ep x this
    per round: about factor x N rows, not the ep x N that a worst-case buffer holds."""
    f = c.expert_capacity_factor if c.expert_capacity_factor is not None else DROPLESS_BUFFER_FACTOR
    return int(min(n_rows, max(1, math.ceil(f * n_rows / ep))))


def _exchange_rounds(round_fn, n_rows: int, cap: int, max_send, c: ModelConfig, zeros):
    """Round 0, then (dropless only) the overflow rounds 1.. that some pair needs.

    `round_fn(r)` gives this device's [N, H] results (sorted order) of the rows it sent in round r.
    The overflow rounds run in a scan, each under a `cond` on a predicate every device of the
    expert group agrees on (the largest count any pair sends), and rematerialised: the step
    keeps no per-round buffers for the backward pass, so memory stays one round's."""
    y = round_fn(jnp.int32(0))
    rounds_max = -(-n_rows // cap)
    if c.expert_capacity_factor is not None or rounds_max <= 1:
        return y
    needed = -(-jax.lax.pmax(max_send, "expert") // cap)

    @jax.checkpoint
    def body(acc, r):
        return acc + jax.lax.cond(r < needed, round_fn, lambda _: zeros, r), None

    y, _ = jax.lax.scan(body, y, jnp.arange(1, rounds_max, dtype=jnp.int32))
    return y


def _dispatch_expert_parallel(
    x_TH, idx_TK, gates_TK, p, c: ModelConfig, ep: int, token_axes=sharding.TOKEN_AXES
):
    """Body of the shard_map: local tokens, local experts, padded all-to-all over `expert`
    (`token_axes`: the mesh axes the tokens are split over, where the drops are summed).

    Each (source, destination) pair gets a buffer of `exchange_capacity` rows per round, so a
    device receives and computes ~factor x T*K rows, not ep x T*K. Dropless by default: rows past
    the capacity go in overflow rounds (`_exchange_rounds`); with `expert_capacity_factor` they
    are dropped and counted instead.
    """
    T, K = idx_TK.shape
    H = x_TH.shape[-1]
    N = T * K
    E_loc = p["w_gate"].shape[0]
    flat = idx_TK.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    dest = flat[order] // E_loc  # destination shard of each sorted row
    send = jnp.bincount(dest, length=ep)
    start = jnp.cumsum(send) - send
    slot = jnp.arange(N) - start[dest]  # row's place in its destination's rows
    cap = exchange_capacity(c, N, ep)
    x_sorted = x_TH[order // K]
    e_sorted = (flat[order] % E_loc).astype(jnp.int32)

    def round_fn(r):
        lo = r * cap
        here = (slot >= lo) & (slot < lo + cap)
        s = jnp.where(here, slot - lo, cap)  # other rounds' rows go to a scratch row, cut off
        # The buffer gathers its rows (take_rows: a gather both ways): a float scatter with the
        # scratch row's repeated indices would be differentiated by tagging every element with
        # a u32 id, arrays of the buffer's full size.
        src = jnp.full((ep, cap + 1), N, jnp.int32).at[dest, s].set(jnp.arange(N, dtype=jnp.int32))
        inv = jnp.where(here, dest * cap + s, ep * cap)  # where each sorted row goes, if here
        buf = take_rows(x_sorted, src[:, :cap].reshape(-1), inv).reshape(ep, cap, H)
        eid = jnp.full((ep, cap + 1), E_loc, jnp.int32).at[dest, s].set(e_sorted)[:, :cap]
        recv = jax.lax.all_to_all(buf, "expert", 0, 0, tiled=True)  # [ep, cap, H] by source
        recv_eid = jax.lax.all_to_all(eid, "expert", 0, 0, tiled=True)
        r_flat, r_eid = recv.reshape(ep * cap, H), recv_eid.reshape(-1)
        r_order = jnp.argsort(r_eid, stable=True)  # empty rows (id E_loc) sort last
        sizes = jnp.bincount(r_eid, length=E_loc).astype(jnp.int32)
        y = grouped_mlp(r_flat[r_order], p, sizes, c)
        y = jnp.zeros_like(y).at[r_order].set(y, unique_indices=True).reshape(ep, cap, H)
        back = jax.lax.all_to_all(y, "expert", 0, 0, tiled=True)  # results, by destination
        return jnp.where(here[:, None], back[dest, jnp.minimum(s, cap - 1)], 0)

    zeros = jnp.zeros((N, H), jnp.dtype(c.dtype))
    y_sorted = _exchange_rounds(round_fn, N, cap, send.max(), c, zeros)
    # A permutation: unique indices, so JAX differentiates the scatter without per-element ids.
    y_TKH = jnp.zeros_like(y_sorted).at[order].set(y_sorted, unique_indices=True)
    y_TKH = y_TKH.reshape(T, K, H)
    out = einsum_f32("tkh,tk->th", y_TKH, gates_TK.astype(y_sorted.dtype))
    kept = slot < (cap if c.expert_capacity_factor is not None else N)
    dropped = jax.lax.psum(jnp.sum(~kept), token_axes) if token_axes else jnp.sum(~kept)
    return out, dropped


def _dispatch_expert_parallel_ragged(x_TH, idx_TK, gates_TK, p, c: ModelConfig, ep: int):
    """Body of the shard_map on backends with `ragged_all_to_all` (GPU, TPU): each shard sends
    exactly the rows its peers need, packed, at most `exchange_capacity` rows per pair and round
    (overflow rounds as in the padded exchange), so the receive buffer and the grouped matmul
    hold ~factor x T*K rows, not ep x T*K. Same result as the padded exchange."""
    T, K = idx_TK.shape
    H = x_TH.shape[-1]
    N = T * K
    E_loc = p["w_gate"].shape[0]
    flat = idx_TK.reshape(-1)
    order = jnp.argsort(flat, stable=True)
    eid = flat[order]
    send = jnp.bincount(eid // E_loc, length=ep).astype(jnp.int32)  # rows to each shard
    start = jnp.cumsum(send) - send
    me = jax.lax.axis_index("expert")
    all_send = jax.lax.all_gather(send, "expert")  # [source, destination]
    cap = exchange_capacity(c, N, ep)
    R = ep * cap  # rows a device receives per round, at most
    x_sorted = x_TH[order // K]
    e_sorted = (eid % E_loc).astype(jnp.int32)
    exchange = functools.partial(jax.lax.ragged_all_to_all, axis_name="expert")

    def round_fn(r):
        lo = r * cap
        n_r = jnp.clip(all_send - lo, 0, cap)  # rows each pair sends this round
        snd = n_r[me]
        in_off = start + lo
        out_off = (jnp.cumsum(n_r, 0) - n_r)[me]  # my rows' place in each receiver
        rcv = n_r[:, me]
        r_x = exchange(x_sorted, jnp.zeros((R, H), x_TH.dtype), in_off, snd, out_off, rcv)
        r_e = exchange(e_sorted, jnp.full((R,), E_loc, jnp.int32), in_off, snd, out_off, rcv)
        r_order = jnp.argsort(r_e, stable=True)
        sizes = jnp.bincount(r_e, length=E_loc).astype(jnp.int32)
        y = grouped_mlp(r_x[r_order], p, sizes, c)
        y = jnp.zeros_like(y).at[r_order].set(y, unique_indices=True)
        back_out = jax.lax.all_gather(in_off, "expert")[:, me]
        return exchange(y, jnp.zeros((N, H), y.dtype), jnp.cumsum(rcv) - rcv, rcv, back_out, snd)

    zeros = jnp.zeros((N, H), jnp.dtype(c.dtype))
    y_sorted = _exchange_rounds(round_fn, N, cap, send.max(), c, zeros)
    y_TKH = jnp.zeros_like(y_sorted).at[order].set(y_sorted, unique_indices=True)
    y_TKH = y_TKH.reshape(T, K, H)
    out = einsum_f32("tkh,tk->th", y_TKH, gates_TK.astype(y_sorted.dtype))
    return out, jnp.zeros((), jnp.int32)


def use_ragged_exchange(c: ModelConfig) -> bool:
    """`ragged_all_to_all` where the backend has it (not XLA:CPU, even when tracing for the GPU's
    paths: it cannot compile it) and the run is dropless."""
    if c.expert_exchange == "auto":
        return c.expert_capacity_factor is None and target.platform() in ("gpu", "tpu")
    return c.expert_exchange == "ragged"


def _ep_body(x_BTH, idx_BTK, gates_BTK, experts, c, ep, token_axes):
    """A device's tokens through the exchange, all at once or (`moe_token_chunk`) chunk by chunk:
    every device of the expert group has as many tokens, so they all run as many exchanges. A
    chunk is rematerialised, so the backward keeps only its inputs, not its exchange buffers."""
    B, T, H = x_BTH.shape
    args = (x_BTH.reshape(B * T, H), idx_BTK.reshape(B * T, -1), gates_BTK.reshape(B * T, -1))

    def dispatch(x_TH, idx_TK, gates_TK):
        if use_ragged_exchange(c):
            return _dispatch_expert_parallel_ragged(x_TH, idx_TK, gates_TK, experts, c, ep)
        return _dispatch_expert_parallel(x_TH, idx_TK, gates_TK, experts, c, ep, token_axes)

    chunk = c.moe_token_chunk
    if not chunk or chunk >= B * T:
        y, dropped = dispatch(*args)
        return y.reshape(B, T, H), dropped
    if (B * T) % chunk:
        raise ValueError(
            f"moe_token_chunk={chunk} does not divide a device's {B * T} tokens "
            "(its share of batch x sequence length)"
        )
    n = B * T // chunk
    y, dropped = jax.lax.map(
        jax.checkpoint(lambda xs: dispatch(*xs)), [a.reshape(n, chunk, -1) for a in args]
    )
    return y.reshape(B, T, H), dropped.sum()


def moe_block(
    x_BTH,
    p,
    c: ModelConfig,
    segment_ids_BT,
    routing_BTK=None,
    mesh: Mesh | sharding.Layout | None = None,
):
    """Routed experts (+ shared experts). Returns (y [B,T,H], stats dict). `mesh`: a Mesh or a
    `sharding.Layout`; experts are parallel over the mesh axis its `experts` rule names."""
    B, T, H = x_BTH.shape
    x_TH = x_BTH.reshape(B * T, H)
    routing = None if routing_BTK is None else routing_BTK.reshape(B * T, -1)
    ep = sharding.axis_size(mesh, sharding.axes_of(mesh, "experts"))
    # The only dispatch that reuses the kernel's sorted order: one device's (a sharded mesh runs
    # the kernel per device for the gates; the dispatch sorts each device's tokens itself).
    local = c.moe_impl != "dense" and ep == 1
    devices = 1 if mesh is None else sharding.mesh_of(mesh).size
    reuse_order = local and devices == 1
    idx, gates, scores, pairs = route(x_TH, p, c, routing, sorted_pairs=reuse_order, mesh=mesh)
    experts = {k: p[k] for k in ("w_gate", "w_up", "w_down")}
    if c.expert_gather_in_dtype:  # cast where the shards are (XLA:GPU gathers bf16), every path
        experts = {k: w.astype(jnp.dtype(c.dtype)) for k, w in experts.items()}
    dropped = jnp.zeros((), jnp.int32)
    if c.moe_impl == "dense":
        y = _dispatch_dense(x_TH, idx, gates, experts, c)
    elif local:
        # Dropless, so each device can sort and run its own tokens against the whole experts
        # (gathered over FSDP like any weight); over the global tokens XLA would gather them for
        # the sort, and gather the Pallas grouped kernels' operands (no partitioning rule).
        def dispatch(x, i, g, w):
            return (_dispatch_local(x, i, g, w, c, pairs),)

        tokens = sharding.axis_size(mesh, sharding.token_axes(mesh))
        if not reuse_order and x_TH.shape[0] % tokens == 0:
            dispatch = sharding.per_device_tokens(dispatch, mesh, (True, True, True, False), 1)
        (y,) = dispatch(x_TH, idx, gates, experts)
    else:
        layout = sharding.as_layout(mesh)
        tok = sharding.logical_to_spec(("batch", "seq", None), layout.rules)
        token_axes = sharding.token_axes(layout)
        fn = jax.shard_map(
            lambda x, i, g, w: _ep_body(x, i, g, w, c, ep, token_axes),
            mesh=layout.mesh,
            in_specs=(tok, tok, tok, jax.tree.map(lambda _: P("expert"), experts)),
            out_specs=(tok, P()),
            check_vma=False,
        )
        y, dropped = fn(x_BTH, idx.reshape(B, T, -1), gates.reshape(B, T, -1), experts)
        y = y.reshape(B * T, H)
    y = y.astype(x_BTH.dtype).reshape(B, T, H)
    if "shared" in p:
        y = y + mlp(x_BTH, p["shared"], c, mesh=mesh)
    valid = segment_ids_BT.reshape(-1) != 0
    load = jnp.zeros(c.n_experts, jnp.int32).at[idx].add(valid[:, None].astype(jnp.int32))
    stats = {
        "topk_idx": idx.reshape(B, T, -1),
        "gates": gates.reshape(B, T, -1),
        "expert_load": load,
        "balance_loss": balance_loss(scores, idx, c, valid),
        "dropped": dropped,
    }
    return y, stats


def update_router_bias(bias_LE: jax.Array, load_LE: jax.Array, rate: float) -> jax.Array:
    """Aux-loss-free balancing (DeepSeek-V3): raise under-loaded experts' bias, lower others."""
    load = load_LE.astype(jnp.float32)
    mean = load.mean(-1, keepdims=True)
    return bias_LE + rate * jnp.sign(mean - load)
