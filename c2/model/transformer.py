"""The decoder: embeddings, stacked dense then MoE layers (scanned), head, MTP modules, decoding.

`forward(params, tokens, cfg, *, positions, segment_ids, cache=None, routing=None)` returns float32
logits [B, T, V] and an `aux` dict:
  topk_idx [L_moe, B, T, k] int32, gates [L_moe, B, T, k], expert_load [L_moe, E] (tokens per
  expert, padding excluded), balance_loss (summed over layers), dropped (expert-exchange
  overflow, 0 when dropless), mtp_hidden [D, B, T, H] (when mtp_depth > 0 and no cache),
  cache (when a cache was given), hidden [B, T, H] (the last layer's output before the final
  norm, when `return_hidden=True`: what MTP drafting feeds on).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from c2 import sharding
from c2.model.attention import attention, init_layer_cache
from c2.model.config import ModelConfig
from c2.model.layers import einsum_f32, linear, mlp, rms_norm
from c2.model.moe import moe_block
from c2.model.moe import update_router_bias as _bias_step
from c2.quant import target


def block(
    x,
    lp,
    c: ModelConfig,
    positions,
    segment_ids,
    mesh,
    moe: bool,
    routing=None,
    cache=None,
    kv_len=None,
):
    """One pre-norm decoder layer: x + attn(norm(x)), then + mlp_or_moe(norm(x))."""
    h, cache = attention(
        rms_norm(x, lp["attn_norm"], c.rms_norm_eps),
        lp["attn"],
        c,
        positions,
        segment_ids,
        mesh,
        cache,
        kv_len,
    )
    x = x + h
    hn = rms_norm(x, lp["mlp_norm"], c.rms_norm_eps)
    if moe:
        y, stats = moe_block(hn, lp["mlp"], c, segment_ids, routing, mesh)
    else:
        y, stats = mlp(hn, lp["mlp"], c, mesh=mesh), None
    x = sharding.constrain(x + y, mesh, ("batch", "seq", None))
    return x, stats, cache


def _unroll_layers() -> bool:
    """Unroll the layer scan on the CPU: XLA:CPU's while loop copies the stacked residuals of
    the backward pass and zero-fills their buffers every step (BENCHMARKS.md); the CPU runs
    only small models, so compile time stays small. Other backends keep the rolled loop (and
    so does c2.bench.plan, tracing the GPU's paths on CPU devices: unrolled, remat's
    recomputation is merged with the forward and every layer's activations are kept)."""
    return target.backend() == "cpu"


def _scan_layers(x, layers, c, positions, segment_ids, mesh, moe, routing, kv_stack, pos, kv_len):
    """Scan a stack of identical layers; routing and the cache (`kv_stack`) are sliced per
    layer. `layers` (and `kv_stack`) may instead be lists of per-layer trees (`unstack`, the
    engine's decoding layout): the loop is then unrolled over them, so no layer's weights or
    cache are sliced out of a stack (XLA copies every slice) or restacked after."""

    def body(x, xs):
        lp, r, kv = xs
        kv = None if kv is None else dict(kv, pos=pos)
        x, stats, kv = block(x, lp, c, positions, segment_ids, mesh, moe, r, kv, kv_len)
        if kv is not None:
            kv.pop("pos")
        return x, (stats, kv)

    if c.remat:
        # prevent_cse=False is right inside a loop; but XLA removes a loop of one trip (Kimi-K2's
        # single dense layer), and in the straight-line code left it would merge the backward's
        # recomputation with the forward, keeping the layer's activations after all.
        one_layer = isinstance(layers, list) or jax.tree.leaves(layers)[0].shape[0] == 1
        body = jax.checkpoint(body, prevent_cse=one_layer)
    if isinstance(layers, list):
        stats, kvs = [], []
        for i, lp in enumerate(layers):
            r = None if routing is None else routing[i]
            x, (st, kv) = body(x, (lp, r, None if kv_stack is None else kv_stack[i]))
            stats.append(st)
            kvs.append(kv)
        stats = None if stats[0] is None else jax.tree.map(lambda *a: jnp.stack(a), *stats)
        return x, stats, None if kv_stack is None else kvs
    x, (stats, kv_stack) = jax.lax.scan(
        body, x, (layers, routing, kv_stack), unroll=_unroll_layers()
    )
    return x, stats, kv_stack


def embed(params, tokens, c: ModelConfig, mesh=None):
    """Token embeddings [B, T, H]. On a mesh the (compute-dtype) table is gathered whole along
    its embed dim first: a lookup from an embed-sharded table lands its rows sharded by embed,
    and when the tokens are sharded over other axes (context parallelism) XLA's partitioner
    can only reshard that by replicating the whole [B, T, H] result (60 GB a GPU at Kimi-K2's
    32k tokens x 128 sequences; `python -m c2.bench.plan`)."""
    table = params["embed"].astype(jnp.dtype(c.dtype))
    if mesh is not None:
        table = sharding.constrain(table, mesh, ("vocab", None))
    return table[tokens]


def lm_head(params, h, c: ModelConfig) -> jax.Array:
    """Final logits in float32 from normed hidden states."""
    w = params["embed"].T if c.tie_word_embeddings else params["lm_head"]
    dtype = jnp.dtype(c.dtype)
    return einsum_f32("...h,hv->...v", h.astype(dtype), w.astype(dtype))


def _check_tokens(tokens, c: ModelConfig):
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"tokens must be an int array [batch, seq], got {tokens.dtype}{list(tokens.shape)}"
        )


def _check_routing(routing, c: ModelConfig, B: int, T: int) -> None:
    """Replayed experts: the shape always; the values too when they are concrete (outside jit)."""
    if routing.shape != (c.n_moe_layers, B, T, c.n_experts_per_token):
        raise ValueError(
            f"routing has shape {routing.shape}; expected "
            f"[n_moe_layers={c.n_moe_layers}, {B}, {T}, k={c.n_experts_per_token}]"
        )
    from pallas_kernels.router_replay import check_routing

    try:
        values = np.asarray(routing)
    except (jax.errors.TracerArrayConversionError, RuntimeError):
        # Traced inside jit, or spread over other hosts: unread, and nothing reads out of bounds
        # either (tests/model/test_model_kernels.py).
        return
    check_routing(values, c.n_experts, name="routing")


def forward(
    params,
    tokens,
    cfg: ModelConfig,
    *,
    positions=None,
    segment_ids=None,
    cache=None,
    routing=None,
    mesh: Mesh | sharding.Layout | None = None,
    return_hidden: bool = False,
    kv_len: int | None = None,
):
    """Logits [B,T,V] float32 and aux (see module doc); `routing` [L_moe,B,T,k] replays experts.
    `kv_len` (static, with a cache): attend only to the cache's first kv_len slots, which must
    hold every row's pos + T (decoding short sequences in a long cache). `mesh`: a
    `sharding.Layout` lays out every activation by its rules (a bare Mesh: by RULES)."""
    c = cfg
    mesh = sharding.as_layout(mesh)
    _check_tokens(tokens, c)
    B, T = tokens.shape
    if positions is None:
        start = cache["pos"][:, None] if cache is not None else 0
        positions = start + jnp.arange(T, dtype=jnp.int32)[None]
    positions = jnp.broadcast_to(positions, (B, T)).astype(jnp.int32)
    if segment_ids is None:
        segment_ids = jnp.ones((B, T), jnp.int32)
    if routing is not None:
        _check_routing(routing, c, B, T)
    if mesh is not None:
        sharding.check_divisible(
            mesh,
            batch=B,
            seq=T if cache is None else None,
            n_experts=c.n_experts,
            n_heads=c.n_heads,
            n_kv_heads=None if c.is_mla else c.n_kv_heads,
        )
    x = sharding.constrain(embed(params, tokens, c, mesh), mesh, ("batch", "seq", None))
    new_cache = None if cache is None else {"pos": cache["pos"]}
    aux = {}
    # Dense layers first, then MoE layers: each group is one stacked scan.
    for group, moe, n in (("dense", False, c.first_k_dense), ("moe", True, c.n_moe_layers)):
        if not n:
            continue
        x, stats, kv = _scan_layers(
            x,
            params[f"{group}_layers"],
            c,
            positions,
            segment_ids,
            mesh,
            moe,
            routing if moe else None,
            None if cache is None else cache[group],
            None if cache is None else cache["pos"],
            kv_len,
        )
        if cache is not None:
            new_cache[group] = kv
        if moe:
            aux = {
                "topk_idx": stats["topk_idx"],
                "gates": stats["gates"],
                "expert_load": stats["expert_load"],
                "balance_loss": stats["balance_loss"].sum(),
                "dropped": stats["dropped"].sum(),
            }
    logits = lm_head(params, rms_norm(x, params["final_norm"], c.rms_norm_eps), c)
    if return_hidden:
        aux["hidden"] = x
    if c.mtp_depth and cache is None:
        aux["mtp_hidden"] = _mtp(params, x, tokens, c, positions, segment_ids, mesh)
    if cache is not None:
        new_cache["pos"] = cache["pos"]
        aux["cache"] = new_cache
    return logits, aux


# Multi-token prediction -------------------------------------------------------------------------


def _mtp(params, h, tokens, c: ModelConfig, positions, segment_ids, mesh):
    """DeepSeek-V3 MTP: depth d at position t sees h^{d-1}_t and the embedding of token t+d."""
    outs = []
    for d in range(c.mtp_depth):
        nxt = jnp.pad(tokens[:, d + 1 :], ((0, 0), (0, d + 1)))  # token t+d+1; tail masked by loss

        def module(params, h, nxt, d=d):
            out, _ = mtp_module(
                params, d, h, nxt, c, positions=positions, segment_ids=segment_ids, mesh=mesh
            )
            return out

        # Rematerialised like the layers: each module is a whole (MoE) block outside the scan.
        h = (jax.checkpoint(module) if c.remat else module)(params, h, nxt)
        outs.append(h)
    return jnp.stack(outs)


def mtp_module(
    params,
    depth: int,
    h,
    next_tokens,
    cfg: ModelConfig,
    *,
    positions,
    segment_ids=None,
    mesh=None,
    cache=None,
    kv_len=None,
):
    """One MTP module (0-based `depth`): hidden h [B,T,H] at t and token t+depth+1 [B,T] -> the
    module's hidden [B,T,H] (and its one-layer cache, `pos` included, when a cache is given)."""
    c = cfg
    mp = mtp_params(params, depth)
    if segment_ids is None:
        segment_ids = jnp.ones(next_tokens.shape, jnp.int32)
    e = rms_norm(embed(params, next_tokens, c, mesh), mp["enorm"], c.rms_norm_eps)
    hn = rms_norm(h, mp["hnorm"], c.rms_norm_eps)
    h = linear(jnp.concatenate([e, hn], -1), mp["eh_proj"], c, mesh=mesh)
    h, _, cache = block(
        h,
        mp["block"],
        c,
        positions,
        segment_ids,
        mesh,
        c.n_moe_layers > 0,
        cache=cache,
        kv_len=kv_len,
    )
    return h, cache


def mtp_params(params, depth: int) -> dict:
    """MTP module `depth`'s parameters, from the stacked tree or an `unstack`ed one."""
    if isinstance(params["mtp"], list):
        return params["mtp"][depth]
    return jax.tree.map(lambda a: a[depth], params["mtp"])


def mtp_logits(params, aux, cfg: ModelConfig) -> jax.Array:
    """[D,B,T,V]: depth d (0-based) at position t predicts token t + d + 2."""
    norm = jax.vmap(lambda h, w: rms_norm(h, w, cfg.rms_norm_eps))(
        aux["mtp_hidden"], params["mtp"]["norm"]
    )
    return lm_head(params, norm, cfg)


def update_router_bias(params, aux, cfg: ModelConfig, rate: float):
    """Aux-loss-free load balancing, applied after the optimiser step (not a gradient)."""
    if "router_bias" not in params.get("moe_layers", {}).get("mlp", {}):
        return params
    mlp_p = params["moe_layers"]["mlp"]
    new = dict(mlp_p, router_bias=_bias_step(mlp_p["router_bias"], aux["expert_load"], rate))
    return dict(params, moe_layers=dict(params["moe_layers"], mlp=new))


# Decoding ---------------------------------------------------------------------------------------


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> dict:
    """Empty KV cache; `pos` [B] counts the tokens written per row."""
    dtype = jnp.dtype(dtype or cfg.dtype)
    cache = {"pos": jnp.zeros((batch,), jnp.int32)}
    if cfg.first_k_dense:
        cache["dense"] = init_layer_cache(cfg, cfg.first_k_dense, batch, max_len, dtype)
    if cfg.n_moe_layers:
        cache["moe"] = init_layer_cache(cfg, cfg.n_moe_layers, batch, max_len, dtype)
    return cache


LAYER_GROUPS = {"dense_layers": "dense", "moe_layers": "moe"}  # params key: cache key


def unstack(tree: dict) -> dict:
    """Params or a KV cache with every layer stack (and the MTP modules) split into a list of
    per-layer trees: the decoding layout, which `forward` and `mtp_module` take as they take the
    stacked one. Each layer then has buffers of its own, so a compiled decode step reads its
    weights in place and updates its (donated) cache in place, where slicing a stack copies each
    layer's weights and cache on every call and restacks the cache after (BENCHMARKS.md)."""
    out = dict(tree)
    for key in (*LAYER_GROUPS, *LAYER_GROUPS.values(), "mtp"):
        if key in out and not isinstance(out[key], list):
            n = jax.tree.leaves(out[key])[0].shape[0]
            out[key] = [jax.tree.map(lambda a, i=i: a[i], out[key]) for i in range(n)]
    return out


def restack(tree: dict) -> dict:
    """The inverse of `unstack`."""
    out = dict(tree)
    for key in (*LAYER_GROUPS, *LAYER_GROUPS.values(), "mtp"):
        if isinstance(out.get(key), list):
            out[key] = jax.tree.map(lambda *a: jnp.stack(a), *out[key])
    return out


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def prefill(params, tokens, cache, lengths, cfg: ModelConfig):
    """Run prompts [B,T] (right-padded to T; real lengths [B]) into the cache at its positions.

    Returns (logits [B,T,V], aux, cache) with cache.pos advanced by `lengths`.
    """
    logits, aux = forward(params, tokens, cfg, cache=cache)
    new = aux.pop("cache")
    new["pos"] = cache["pos"] + lengths.astype(jnp.int32)
    return logits, aux, new


@functools.partial(jax.jit, static_argnames=("cfg",), donate_argnames=("cache",))
def decode_step(params, tokens, cache, cfg: ModelConfig):
    """One token per row [B,1] -> (logits [B,1,V], aux, cache advanced by one)."""
    logits, aux = forward(params, tokens, cfg, cache=cache)
    new = aux.pop("cache")
    new["pos"] = cache["pos"] + 1
    return logits, aux, new
