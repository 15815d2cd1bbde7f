"""MoE router replay (docs/recipe.md §2): force recorded experts, keep gradients to the router.

From router logits [T, E] and expert indices [T, K] (replayed from inference, or a live top-k from
`live_topk`) it computes what the grouped expert matmul needs:
- gates_TK: score_func(logits) gathered at the indices; for softmax the softmax over all E experts.
  With norm_topk_prob each row is divided by the sum of its K gathered scores (+1e-20 for sigmoid,
  as DeepSeek-V3 does), then multiplied by routed_scaling_factor. float32.
- counts_E / offsets_E: tokens per expert and their exclusive cumsum (int32).
- sort_idx [T*K]: the stable expert-sorted order of the flattened (token, slot) pairs: position i
  of the grouped buffer holds flat pair sort_idx[i] (its token is sort_idx // K); unsort_idx is the
  inverse permutation (flat pair -> position).
Gradients flow from gates_TK to the logits (custom_vjp); the indices get none.

Bad indices. Whenever the indices are concrete (an eager call, or an array closed over rather than
passed through jit) `router_replay` and the reference call `check_routing`, which raises a
ValueError naming the first bad token/slot (out of range, or an expert repeated in one token).
With traced indices (inside jit) nothing is read or written out of bounds: an out-of-range slot
is dropped (gate 0, not counted, and placed after every valid pair in the sorted order, in flat
order, so a ragged_dot with group_sizes=counts_E never sees it); a repeated expert is routed once
per slot (and counted twice in the normalisation).

The kernels (Triton backend on GPU, interpret mode on CPU) work on tiles of `block_t` tokens:
  1. gates and a per-tile histogram over expert bins (valid experts, then "dropped", then padding),
  2. (XLA, tiny) per-tile bases: exclusive cumsum of the histograms over tiles and bins,
  3. each pair's position = its tile's base for its bin + its rank among equal bins in the tile,
     written as unsort_idx and scattered into sort_idx (a permutation, so no two programs collide).
The backward kernel recomputes the scores and returns d logits.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from pallas_kernels import resolve_interpret

try:  # the Triton backend of Pallas
    from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
    plgpu = None

SCORE_FUNCS = ("sigmoid", "softmax")
SIGMOID_NORM_EPS = 1e-20


class RouteResult(NamedTuple):
    gates_TK: jax.Array  # float32 [T, K]
    counts_E: jax.Array  # int32 [E]
    offsets_E: jax.Array  # int32 [E]
    sort_idx: jax.Array  # int32 [T*K]
    unsort_idx: jax.Array  # int32 [T*K]


def check_routing(idx_TK, num_experts: int, name: str = "idx_TK") -> None:
    """Raise a ValueError naming the first (token, slot) whose expert is out of range or repeated.

    Runs on concrete values (numpy), outside jit. `idx_TK` may have leading axes ([..., T, K], as
    the model's routing [L_moe, B, T, K]); the message names the full index into `name`.
    """
    idx = np.asarray(idx_TK)
    if idx.ndim < 2 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"{name} {idx.shape} {idx.dtype}: expected an integer array [..., T, K]")
    bad_range = (idx < 0) | (idx >= num_experts)
    k = idx.shape[-1]
    # repeated[..., t, j]: slot j repeats an expert of an earlier slot of token t.
    earlier = np.tril(np.ones((k, k), bool), -1)  # [j, i]: i < j
    repeated = ((idx[..., :, None] == idx[..., None, :]) & earlier).any(axis=-1)
    bad = bad_range | repeated
    if not bad.any():
        return
    where = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
    value, at = int(idx[where]), f"{name}[{', '.join(str(int(i)) for i in where)}]"
    if bad_range[where]:
        raise ValueError(f"{at} = {value}: expert index out of range [0, {num_experts})")
    *token, j = where
    first = int(np.flatnonzero(idx[tuple(token)][:j] == value)[0])
    raise ValueError(
        f"{at} = {value}: expert repeated for token {int(token[-1])} (also in slot {first})"
    )


def _check_args(logits_TE, idx_TK, score_func, norm_topk_prob, routed_scaling_factor) -> None:
    if logits_TE.ndim != 2 or not jnp.issubdtype(logits_TE.dtype, jnp.floating):
        raise ValueError(f"logits_TE {logits_TE.shape} {logits_TE.dtype}: expected float [T, E]")
    if idx_TK.ndim != 2 or not jnp.issubdtype(idx_TK.dtype, jnp.integer):
        raise ValueError(f"idx_TK {idx_TK.shape} {idx_TK.dtype}: expected int [T, K]")
    if idx_TK.shape[0] != logits_TE.shape[0]:
        raise ValueError(
            f"idx_TK {idx_TK.shape} and logits_TE {logits_TE.shape}: token counts (T) differ"
        )
    if score_func not in SCORE_FUNCS:
        raise ValueError(f"score_func={score_func!r}: expected one of {SCORE_FUNCS}")
    if not isinstance(norm_topk_prob, bool):
        raise ValueError(f"norm_topk_prob={norm_topk_prob!r}: expected a bool")
    if isinstance(routed_scaling_factor, bool) or not isinstance(
        routed_scaling_factor, (int, float)
    ):
        raise ValueError(f"routed_scaling_factor={routed_scaling_factor!r}: expected a float")
    try:
        idx = np.asarray(idx_TK)
    except jax.errors.TracerArrayConversionError:
        return  # inside jit: bad indices are dropped (module docstring)
    check_routing(idx, logits_TE.shape[1])


# --- reference ----------------------------------------------------------------------------------


def _scores(logits_f32: jax.Array, score_func: str) -> jax.Array:
    if score_func == "sigmoid":
        return jax.nn.sigmoid(logits_f32)
    return jax.nn.softmax(logits_f32, axis=-1)


def _normalize(raw_TK, score_func, norm_topk_prob, routed_scaling_factor):
    if norm_topk_prob:
        denom = jnp.sum(raw_TK, axis=-1, keepdims=True)
        if score_func == "sigmoid":
            raw_TK = raw_TK / (denom + SIGMOID_NORM_EPS)
        else:  # a token whose slots were all dropped keeps zero gates instead of 0/0
            raw_TK = jnp.where(denom > 0, raw_TK / jnp.where(denom > 0, denom, 1.0), 0.0)
    return raw_TK * jnp.float32(routed_scaling_factor)


def router_replay_reference(
    logits_TE: jax.Array,
    idx_TK: jax.Array,
    *,
    score_func: str,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
    interpret: bool | None = None,
) -> RouteResult:
    """`router_replay` in plain jnp (gather, scatter-add, stable argsort); autodiff gradients."""
    del interpret  # same signature as the kernel
    _check_args(logits_TE, idx_TK, score_func, norm_topk_prob, routed_scaling_factor)
    t, e = logits_TE.shape
    k = idx_TK.shape[1]
    idx = idx_TK.astype(jnp.int32)
    valid = (idx >= 0) & (idx < e)
    scores = _scores(logits_TE.astype(jnp.float32), score_func)
    raw = jnp.where(valid, jnp.take_along_axis(scores, jnp.where(valid, idx, 0), axis=1), 0.0)
    gates = _normalize(raw, score_func, norm_topk_prob, routed_scaling_factor)
    bins = jnp.where(valid, idx, e).reshape(-1)
    counts = jnp.zeros((e + 1,), jnp.int32).at[bins].add(1)[:e]
    sort_idx = jnp.argsort(bins, stable=True).astype(jnp.int32)
    unsort_idx = jnp.zeros((t * k,), jnp.int32).at[sort_idx].set(jnp.arange(t * k, dtype=jnp.int32))
    return RouteResult(gates, counts, jnp.cumsum(counts) - counts, sort_idx, unsort_idx)


def live_topk(
    logits_TE: jax.Array, k: int, *, score_func: str, correction_bias_E: jax.Array | None = None
) -> jax.Array:
    """Live routing: the top-k experts of score_func(logits) (+ a selection-only bias, as in
    DeepSeek-V3's e_score_correction_bias), int32 [T, k], ready for `router_replay`."""
    if score_func not in SCORE_FUNCS:
        raise ValueError(f"score_func={score_func!r}: expected one of {SCORE_FUNCS}")
    if not 1 <= k <= logits_TE.shape[-1]:
        raise ValueError(f"k={k}: expected 1 <= k <= num_experts={logits_TE.shape[-1]}")
    scores = _scores(logits_TE.astype(jnp.float32), score_func)
    if correction_bias_E is not None:
        scores = scores + correction_bias_E.astype(jnp.float32)
    return jax.lax.top_k(scores, k)[1].astype(jnp.int32)


# --- kernels ------------------------------------------------------------------------------------


class _Config(NamedTuple):
    score_func: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    num_tokens: int
    num_experts: int
    top_k: int
    block_t: int
    interpret: bool


def _compiler_params(cfg: _Config):
    if cfg.interpret or plgpu is None:
        return None
    return plgpu.CompilerParams(num_warps=4, num_stages=1)


def _tile_scores(logits_ref, cfg: _Config):
    """scores [bt, Ep] (0 in padded expert columns) and the column ids [1, Ep]."""
    x = logits_ref[...].astype(jnp.float32)
    col = jnp.arange(x.shape[1], dtype=jnp.int32)[None, :]
    if cfg.score_func == "sigmoid":
        return jax.nn.sigmoid(x), col
    x = jnp.where(col < cfg.num_experts, x, -jnp.inf)
    z = jnp.exp(x - jnp.max(x, axis=1, keepdims=True))
    return z / jnp.sum(z, axis=1, keepdims=True), col


def _slot_info(idx_ref, k: int, cfg: _Config):
    """For slot k of the tile: expert ids [bt], valid [bt], real (not padding) [bt], rows [bt]."""
    bt = idx_ref.shape[0]
    rows = pl.program_id(0) * bt + jnp.arange(bt, dtype=jnp.int32)
    real = (rows < cfg.num_tokens) & (k < cfg.top_k)
    expert = idx_ref[:, k]
    valid = real & (expert >= 0) & (expert < cfg.num_experts)
    return expert, valid, real, rows


def _bin(expert, valid, real, cfg: _Config):
    # Bins: experts 0..E-1, then E for dropped (out-of-range) slots, then E+1 for padding.
    return jnp.where(valid, expert, jnp.where(real, cfg.num_experts, cfg.num_experts + 1))


def _onehot(col, idx_ref, k: int, cfg: _Config):
    """[bt, Ep] one-hot of slot k's expert; all-false for dropped and padding slots."""
    expert, valid, _, _ = _slot_info(idx_ref, k, cfg)
    return (col == expert[:, None]) & valid[:, None]


def _gathered(scores, col, idx_ref, cfg: _Config):
    """Raw gathered score [bt] of each slot (0 for dropped and padding slots)."""
    return [
        jnp.sum(jnp.where(_onehot(col, idx_ref, k, cfg), scores, 0.0), axis=1)
        for k in range(idx_ref.shape[1])
    ]


def _denominator(raws, cfg: _Config):
    denom = functools.reduce(jnp.add, raws)
    if cfg.score_func == "sigmoid":
        return denom + SIGMOID_NORM_EPS, None
    positive = denom > 0
    return jnp.where(positive, denom, 1.0), positive


def _gates_counts_kernel(logits_ref, idx_ref, gates_ref, counts_ref, *, cfg: _Config):
    scores, col = _tile_scores(logits_ref, cfg)
    raws = _gathered(scores, col, idx_ref, cfg)
    scale = jnp.float32(cfg.routed_scaling_factor)
    if cfg.norm_topk_prob:
        denom, positive = _denominator(raws, cfg)
    for k, raw in enumerate(raws):
        gate = raw
        if cfg.norm_topk_prob:
            gate = raw / denom
            if positive is not None:
                gate = jnp.where(positive, gate, 0.0)
        gates_ref[:, k] = gate * scale
    bins_col = jnp.arange(counts_ref.shape[1], dtype=jnp.int32)[None, :]
    hist = jnp.zeros((counts_ref.shape[1],), jnp.int32)
    for k in range(idx_ref.shape[1]):
        b = _bin(*_slot_info(idx_ref, k, cfg)[:3], cfg)
        hist = hist + jnp.sum((bins_col == b[:, None]).astype(jnp.int32), axis=0)
    counts_ref[...] = hist[None, :]


def _positions_kernel(idx_ref, base_ref, pos_ref, sort_ref, *, cfg: _Config):
    kp = idx_ref.shape[1]
    bins_col = jnp.arange(base_ref.shape[1], dtype=jnp.int32)[None, :]
    slots = [_slot_info(idx_ref, k, cfg) for k in range(kp)]
    bins = [_bin(expert, valid, real, cfg) for expert, valid, real, _ in slots]
    # One-hots are rebuilt per use rather than kept: [bt, bins] each, K of them would spill.
    per_token = sum((bins_col == b[:, None]).astype(jnp.int32) for b in bins)  # [bt, bins]
    # Pairs of earlier tokens of this tile in each bin, plus all earlier tiles' pairs of that bin.
    before = jnp.cumsum(per_token, axis=0) - per_token + base_ref[...]
    for k in range(kp):
        same_earlier_slot = sum(((bins[j] == bins[k]).astype(jnp.int32) for j in range(k)), 0)
        pos = jnp.sum(jnp.where(bins_col == bins[k][:, None], before, 0), axis=1)
        pos = pos + same_earlier_slot
        _, _, real, rows = slots[k]
        pos_ref[:, k] = pos
        sort_ref[pos] = jnp.where(real, rows * cfg.top_k + k, -1)


def _bwd_kernel(logits_ref, idx_ref, dgates_ref, dlogits_ref, *, cfg: _Config):
    scores, col = _tile_scores(logits_ref, cfg)
    raws = _gathered(scores, col, idx_ref, cfg)
    scale = jnp.float32(cfg.routed_scaling_factor)
    dgates = [dgates_ref[:, k] * scale for k in range(idx_ref.shape[1])]
    if cfg.norm_topk_prob:  # g_k = r_k / D, D = sum_j r_j (+ eps)
        denom, positive = _denominator(raws, cfg)
        dot = functools.reduce(jnp.add, [dg * raw for dg, raw in zip(dgates, raws)])
        draws = [dg / denom - dot / (denom * denom) for dg in dgates]
        if positive is not None:
            draws = [jnp.where(positive, d, 0.0) for d in draws]
    else:
        draws = dgates
    dscores = jnp.zeros(scores.shape, jnp.float32)
    for k, d in enumerate(draws):
        dscores = dscores + jnp.where(_onehot(col, idx_ref, k, cfg), d[:, None], 0.0)
    if cfg.score_func == "sigmoid":
        dlogits = dscores * scores * (1.0 - scores)
    else:
        dlogits = scores * (dscores - jnp.sum(dscores * scores, axis=1, keepdims=True))
    dlogits_ref[...] = dlogits


def _padded(logits_TE, idx_TK, cfg: _Config):
    bt = cfg.block_t
    tp = -(-cfg.num_tokens // bt) * bt
    ep = max(16, pl.next_power_of_2(cfg.num_experts))
    kp = pl.next_power_of_2(cfg.top_k)
    logits = jnp.pad(logits_TE, ((0, tp - cfg.num_tokens), (0, ep - cfg.num_experts)))
    idx = jnp.pad(idx_TK.astype(jnp.int32), ((0, tp - cfg.num_tokens), (0, kp - cfg.top_k)))
    return logits, idx


def _gates_impl(logits_TE, idx_TK, cfg: _Config):
    """Kernel 1: padded gates [Tp, Kp] and per-tile histograms [tiles, bins]."""
    bt = cfg.block_t
    logits, idx = _padded(logits_TE, idx_TK, cfg)
    (tp, ep), kp = logits.shape, idx.shape[1]
    num_tiles = tp // bt
    num_bins = pl.next_power_of_2(cfg.num_experts + 2)
    row_tile = lambda i: (i, 0)
    return pl.pallas_call(
        functools.partial(_gates_counts_kernel, cfg=cfg),
        out_shape=[
            jax.ShapeDtypeStruct((tp, kp), jnp.float32),
            jax.ShapeDtypeStruct((num_tiles, num_bins), jnp.int32),
        ],
        grid=(num_tiles,),
        in_specs=[pl.BlockSpec((bt, ep), row_tile), pl.BlockSpec((bt, kp), row_tile)],
        out_specs=[pl.BlockSpec((bt, kp), row_tile), pl.BlockSpec((1, num_bins), row_tile)],
        compiler_params=_compiler_params(cfg),
        interpret=cfg.interpret,
        name="router_replay_gates",
    )(logits, idx)


def _route_impl(logits_TE, idx_TK, cfg: _Config) -> RouteResult:
    t, e, k, bt = cfg.num_tokens, cfg.num_experts, cfg.top_k, cfg.block_t
    gates, tile_counts = _gates_impl(logits_TE, idx_TK, cfg)
    _, idx = _padded(logits_TE, idx_TK, cfg)
    tp, kp = idx.shape
    num_tiles, num_bins = tile_counts.shape
    row_tile = lambda i: (i, 0)
    totals = jnp.sum(tile_counts, axis=0)
    offsets = jnp.cumsum(totals) - totals
    tile_base = offsets[None, :] + jnp.cumsum(tile_counts, axis=0) - tile_counts
    positions, sort_full = pl.pallas_call(
        functools.partial(_positions_kernel, cfg=cfg),
        out_shape=[
            jax.ShapeDtypeStruct((tp, kp), jnp.int32),
            jax.ShapeDtypeStruct((tp * kp,), jnp.int32),
        ],
        grid=(num_tiles,),
        in_specs=[pl.BlockSpec((bt, kp), row_tile), pl.BlockSpec((1, num_bins), row_tile)],
        out_specs=[pl.BlockSpec((bt, kp), row_tile), pl.BlockSpec((tp * kp,), lambda i: (0,))],
        compiler_params=_compiler_params(cfg),
        interpret=cfg.interpret,
        name="router_replay_positions",
    )(idx, tile_base.astype(jnp.int32))
    return RouteResult(
        gates_TK=gates[:t, :k],
        counts_E=totals[:e],
        offsets_E=offsets[:e],
        sort_idx=sort_full[: t * k],
        unsort_idx=positions[:t, :k].reshape(t * k),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _route(logits_TE, idx_TK, cfg: _Config) -> RouteResult:
    return _route_impl(logits_TE, idx_TK, cfg)


def _route_fwd(logits_TE, idx_TK, cfg: _Config):
    return _route_impl(logits_TE, idx_TK, cfg), (logits_TE, idx_TK)


def _route_bwd(cfg: _Config, res, ct: RouteResult):
    return _dlogits(cfg, res, ct.gates_TK)


def _dlogits(cfg: _Config, res, dgates_TK):
    logits_TE, idx_TK = res
    logits, idx = _padded(logits_TE, idx_TK, cfg)
    (tp, ep), kp = logits.shape, idx.shape[1]
    dgates = jnp.pad(dgates_TK.astype(jnp.float32), ((0, tp - cfg.num_tokens), (0, kp - cfg.top_k)))
    bt = cfg.block_t
    row_tile = lambda i: (i, 0)
    dlogits = pl.pallas_call(
        functools.partial(_bwd_kernel, cfg=cfg),
        out_shape=jax.ShapeDtypeStruct((tp, ep), jnp.float32),
        grid=(tp // bt,),
        in_specs=[
            pl.BlockSpec((bt, ep), row_tile),
            pl.BlockSpec((bt, kp), row_tile),
            pl.BlockSpec((bt, kp), row_tile),
        ],
        out_specs=pl.BlockSpec((bt, ep), row_tile),
        compiler_params=_compiler_params(cfg),
        interpret=cfg.interpret,
        name="router_replay_bwd",
    )(logits, idx, dgates)
    return dlogits[: cfg.num_tokens, : cfg.num_experts].astype(logits_TE.dtype), None


_route.defvjp(_route_fwd, _route_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _gates(logits_TE, idx_TK, cfg: _Config) -> jax.Array:
    return _gates_impl(logits_TE, idx_TK, cfg)[0][: cfg.num_tokens, : cfg.top_k]


def _gates_fwd(logits_TE, idx_TK, cfg: _Config):
    return _gates(logits_TE, idx_TK, cfg), (logits_TE, idx_TK)


_gates.defvjp(_gates_fwd, _dlogits)


def _make_config(logits_TE, idx_TK, score_func, norm_topk_prob, routed_scaling_factor,
                 interpret, block_t) -> _Config:  # fmt: skip
    _check_args(logits_TE, idx_TK, score_func, norm_topk_prob, routed_scaling_factor)
    if block_t < 1 or block_t & (block_t - 1):
        raise ValueError(f"block_t={block_t}: expected a power of two")
    return _Config(
        score_func=score_func,
        norm_topk_prob=norm_topk_prob,
        routed_scaling_factor=float(routed_scaling_factor),
        num_tokens=logits_TE.shape[0],
        num_experts=logits_TE.shape[1],
        top_k=idx_TK.shape[1],
        block_t=block_t,
        interpret=resolve_interpret(interpret),
    )


def router_replay(
    logits_TE: jax.Array,
    idx_TK: jax.Array,
    *,
    score_func: str,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
    interpret: bool | None = None,
    block_t: int = 16,
) -> RouteResult:
    """Gates, per-expert counts/offsets and the expert-sorted permutation (module docstring)."""
    cfg = _make_config(logits_TE, idx_TK, score_func, norm_topk_prob, routed_scaling_factor,
                       interpret, block_t)  # fmt: skip
    return _route(logits_TE, idx_TK, cfg)


def router_replay_gates(
    logits_TE: jax.Array,
    idx_TK: jax.Array,
    *,
    score_func: str,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
    interpret: bool | None = None,
    block_t: int = 16,
) -> jax.Array:
    """`router_replay`'s gates_TK alone: kernel 1 only, no sorted order (for callers that sort
    elsewhere, e.g. the expert-parallel exchange). Same gradients to the logits."""
    cfg = _make_config(logits_TE, idx_TK, score_func, norm_topk_prob, routed_scaling_factor,
                       interpret, block_t)  # fmt: skip
    return _gates(logits_TE, idx_TK, cfg)
