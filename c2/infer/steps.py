"""The engine's compiled functions: feed chunks into some slots in one pass, and a batched decode
step (plain, or MTP speculative) over every slot at once. Shapes are static; slots are rows of
one state.

Params and cache come in the model's decoding layout (c2.model.unstack: a list of per-layer
trees per layer group), so a step reads each layer's weights and updates its cache in place.
On a mesh (`StepSpec.layout`) the forwards lay activations out by its rules and every step's
state is pinned to `engine_layout.state_shardings` (slots split, a GQA cache's kv heads too).

State (a dict of [B] arrays, B = slots, plus the caches):
  cache      the model's KV cache, unstacked; cache["pos"] [B] counts each row's fed tokens.
  tok        the row's pending token: sampled, not yet fed.
  phase      0 idle (free, or paused awaiting more tokens), 1 generating, 2 flush (feed the
             final token once, to record its routing, then go idle).
  rid, n_gen request id and tokens generated so far: the row's RNG key is
             fold_in(fold_in(key(seed), rid), n_gen), so a request's samples do not depend on
             which slot it runs in or what runs beside it.
  budget     tokens the row may still generate this turn.
  pause      on stop, go idle keeping the sequence (multi-turn) instead of flushing.
  stop_ids   [B, n_stop] stop-token ids, -1 padded.
  temperature, top_k, top_p  the row's sampling settings.
  mtp_cache  (speculative only) the MTP module's KV cache: slot j-1 holds token j's entry,
             the module's input at training position t = j-1 being (h_{j-1}, embed(x_j)).
  mtp_h, mtp_tok, mtp_n  (speculative only) entries not yet written, deferred to the next pass
             of the module: mtp_n [B] main-model hidden states mtp_h [B, K+1, H] of the last fed
             tokens (positions pos-mtp_n .. pos-1) and the tokens after them, mtp_tok [B, K+1]
             (the last is the pending token, or the first token of the next fed chunk).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from c2 import sharding
from c2.infer import sampling
from c2.infer.engine_layout import constrain_state, state_shardings
from c2.model.attention import init_layer_cache
from c2.model.config import ModelConfig
from c2.model.layers import rms_norm
from c2.model.transformer import forward, init_cache, lm_head, mtp_module, mtp_params, unstack

GROUPS = ("dense", "moe")


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """Everything static about the compiled steps (hashable: a jit static argument)."""

    cfg: ModelConfig
    n_slots: int
    cache_len: int
    n_stop: int
    speculative: bool
    num_draft: int
    steps_per_call: int
    layout: sharding.Layout | None = None  # the engine's mesh and rules (engine_layout.py)


def attend_len(spec: StepSpec, filled: int, new: int | None = None) -> int | None:
    """The cache length a call attends to when no row it writes holds more than `filled` tokens
    and it writes `new` more (default: a decode call's steps x (drafts + 1)): a power of two
    (>= 128) holding every write, None for the whole cache. Attention (and, feeding a prompt,
    the row's cache it reads) then costs what the sequences need, not the preallocated length,
    for a few compiled variants. A decode call takes a prefix only when it is at most half the
    cache: the slice copies every layer's cache prefix, which a small skip does not repay (batch
    32 on the CPU, `python -m c2.bench.decode_prefix`: a 128 prefix of 208-224 slots is within
    5% of the whole cache either way, of 272-316 slots 0-14% faster, of 528 21% faster)."""
    decode = new is None
    if decode:
        new = spec.steps_per_call * (spec.num_draft + 1)
    need = filled + max(new, spec.num_draft + 1)  # feeding also writes the MTP catch-up
    bucket = max(128, 1 << max(need - 1, 0).bit_length())
    if bucket >= spec.cache_len or (decode and 2 * bucket > spec.cache_len):
        return None
    return bucket


def routing_dtype(cfg: ModelConfig):
    """Packed expert ids: uint8 up to 256 experts, else uint16."""
    return jnp.uint8 if cfg.n_experts <= 256 else jnp.uint16


def init_state(spec: StepSpec) -> dict:
    """The empty state; on a mesh, each array created in its shards (`state_shardings`)."""
    if spec.layout is None:
        return _init_state(spec)
    shapes = jax.eval_shape(functools.partial(_init_state, spec))
    out = state_shardings(shapes, spec.layout)
    return jax.jit(functools.partial(_init_state, spec), out_shardings=out)()


def _init_state(spec: StepSpec) -> dict:
    c, B = spec.cfg, spec.n_slots
    state = {
        "cache": unstack(init_cache(c, B, spec.cache_len)),
        "tok": jnp.zeros((B,), jnp.int32),
        "phase": jnp.zeros((B,), jnp.int32),
        "rid": jnp.zeros((B,), jnp.int32),
        "n_gen": jnp.zeros((B,), jnp.int32),
        "budget": jnp.zeros((B,), jnp.int32),
        "pause": jnp.zeros((B,), bool),
        "stop_ids": jnp.full((B, spec.n_stop), -1, jnp.int32),
        "temperature": jnp.zeros((B,), jnp.float32),
        "top_k": jnp.zeros((B,), jnp.int32),
        "top_p": jnp.ones((B,), jnp.float32),
    }
    if spec.speculative:
        layer = init_layer_cache(c, 1, B, spec.cache_len, jnp.dtype(c.dtype))
        K1 = spec.num_draft + 1
        state["mtp_cache"] = jax.tree.map(lambda a: a[0], layer)
        state["mtp_h"] = jnp.zeros((B, K1, c.d_model), jnp.dtype(c.dtype))
        state["mtp_tok"] = jnp.zeros((B, K1), jnp.int32)
        state["mtp_n"] = jnp.zeros((B,), jnp.int32)
    return state


def _row_keys(base_key, rid_B, n_gen_B):
    return jax.vmap(lambda r, n: jax.random.fold_in(jax.random.fold_in(base_key, r), n))(
        rid_B, n_gen_B
    )


def _pack(topk_idx, cfg: ModelConfig):
    return topk_idx.astype(routing_dtype(cfg))


def _routing(aux, cfg: ModelConfig, B: int, T: int):
    """[L_moe, B, T, k] packed; empty in the layer axis for a dense-only model."""
    if "topk_idx" in aux:
        return _pack(aux["topk_idx"], cfg)
    return jnp.zeros((0, B, T, cfg.n_experts_per_token), routing_dtype(cfg))


@functools.partial(jax.jit, static_argnames=("layout",), donate_argnames=("state",))
def set_rows(state: dict, slot, fields: dict, layout: sharding.Layout | None = None) -> dict:
    """state[name][slot] = value for each field ("pos" is the cache's); `layout`: the
    engine's mesh, kept."""
    state = dict(state)
    for name, value in fields.items():
        if name == "pos":
            state["cache"] = dict(state["cache"], pos=state["cache"]["pos"].at[slot].set(value))
        else:
            state[name] = state[name].at[slot].set(value)
    return constrain_state(state, layout)


def _catch_up(params, mtp_cache, h_BKH, tok_BK, n_B, pos_B, spec: StepSpec, kv_len=None):
    """One MTP pass writing the deferred entries at slots pos-n .. (K+1 static; the ones past
    n-1 are scratch, overwritten later). Returns (module hidden at slot pos-1 [B,1,H], cache)."""
    c = spec.cfg
    K1 = tok_BK.shape[1]
    start = jnp.maximum(pos_B - n_B, 0)
    positions = start[:, None] + jnp.arange(K1)[None]
    g, mtp_cache = mtp_module(
        params,
        0,
        h_BKH,
        tok_BK,
        c,
        positions=positions,
        cache=dict(mtp_cache, pos=start),
        kv_len=kv_len,
        mesh=spec.layout,
    )
    rows = jnp.arange(tok_BK.shape[0])
    return g[rows, jnp.maximum(n_B - 1, 0)][:, None], mtp_cache


def _rows_prefix(a, slots_R, length: int | None):
    """a[slots, :length] of a [B, S, ...] buffer as [R, length, ...] (the whole rows: None);
    padding rows (slot B, out of range) read row B - 1, and `_put_rows_prefix` drops them."""
    length = a.shape[1] if length is None else length
    return a.at[slots_R, :length].get(mode="clip")


def _put_rows_prefix(a, r_R, slots_R):
    length = r_R.shape[1]
    return a.at[slots_R, :length].set(r_R.astype(a.dtype), mode="drop")


def _feed_mtp(params, state, slots_R, s_R, tokens_RC, hidden_RCH, last_R, spec, kv_len):
    """MTP entries of the fed chunks: first each row's deferred entries (its chunk's first token
    completes them), then one for every later chunk token; each row's last real token's hidden
    state is deferred to the next pass (its next token is not known yet)."""
    c = spec.cfg
    R, C = tokens_RC.shape
    rows = jnp.arange(R)
    row = lambda name: state[name].at[slots_R].get(mode="clip")  # noqa: E731
    n = row("mtp_n")
    tok = row("mtp_tok").at[rows, jnp.maximum(n - 1, 0)].set(tokens_RC[:, 0])
    cache = jax.tree.map(lambda a: _rows_prefix(a, slots_R, kv_len), state["mtp_cache"])
    _, cache = _catch_up(params, cache, row("mtp_h"), tok, n, s_R, spec)
    cache.pop("pos")
    pad_h = jnp.zeros((R, 1, c.d_model), hidden_RCH.dtype)
    h_in = jnp.concatenate([hidden_RCH[:, : C - 1], pad_h], 1)  # token j+1 sees hidden j
    tok_in = jnp.concatenate([tokens_RC[:, 1:], tokens_RC[:, :1] * 0], 1)
    _, cache = mtp_module(
        params,
        0,
        h_in,
        tok_in,
        c,
        positions=s_R[:, None] + jnp.arange(C)[None],
        cache=dict(cache, pos=s_R),
        mesh=spec.layout,
    )
    cache.pop("pos")
    state = dict(state)
    state["mtp_cache"] = jax.tree.map(
        lambda a, r: _put_rows_prefix(a, r, slots_R), state["mtp_cache"], cache
    )
    K1 = spec.num_draft + 1
    h = jnp.zeros((R, K1, c.d_model), hidden_RCH.dtype).at[:, 0].set(hidden_RCH[rows, last_R])
    state["mtp_h"] = state["mtp_h"].at[slots_R].set(h, mode="drop")
    state["mtp_n"] = state["mtp_n"].at[slots_R].set(1, mode="drop")
    return state


@functools.partial(jax.jit, static_argnames=("spec", "kv_len"), donate_argnames=("state",))
def feed(params, state: dict, base_key, slots_R, tokens_RC, lengths_R, spec: StepSpec, kv_len=None):
    """Run tokens_RC [R, C] into rows `slots_R` [R] (distinct) at their positions, one forward
    pass for all: row r's first lengths_R[r] (>= 1) tokens are real, the rest padding (written
    past the row's position, where the next write lands). A slot of n_slots (out of range) is a
    padding row: it computes and is dropped. Returns (state, next token sampled from each row's
    last real position [R], its logprob [R], routing [L_moe, R, C, k] packed). kv_len: the rows'
    cache prefix to read, attend to and write (`attend_len`; None: all of it)."""
    c = spec.cfg
    R, C = tokens_RC.shape
    cache = state["cache"]
    s = cache["pos"].at[slots_R].get(mode="clip")
    groups = [g for g in GROUPS if g in cache]

    def take_rows(a):
        return _rows_prefix(a, slots_R, kv_len)

    def put_rows(a, r):
        return _put_rows_prefix(a, r, slots_R)

    rows = {"pos": s, **{g: jax.tree.map(take_rows, cache[g]) for g in groups}}
    logits, aux = forward(params, tokens_RC, c, cache=rows, return_hidden=True, mesh=spec.layout)
    new_rows = aux["cache"]
    state = dict(state)
    state["cache"] = {
        "pos": cache["pos"].at[slots_R].add(lengths_R, mode="drop"),
        **{g: jax.tree.map(put_rows, cache[g], new_rows[g]) for g in groups},
    }
    last = lengths_R - 1
    sl = lambda name: state[name].at[slots_R].get(mode="clip")  # noqa: E731
    logp = sampling.sampling_logprobs(
        logits[jnp.arange(R), last], sl("temperature"), sl("top_k"), sl("top_p")
    )
    token = sampling.sample_rows(
        lambda: _row_keys(base_key, sl("rid"), sl("n_gen")), logp, sl("temperature")
    )
    if spec.speculative:
        state = _feed_mtp(params, state, slots_R, s, tokens_RC, aux["hidden"], last, spec, kv_len)
    state = constrain_state(state, spec.layout)
    return state, token, sampling.take(logp, token), _routing(aux, c, R, C)


def _plain_step(params, state: dict, base_key, spec: StepSpec, kv_len):
    """Feed every row's pending token, sample the next. Outputs use the speculative layout with
    K = 0: tokens/logprobs [B, 1], n_emit, n_fed, accepted [B], drafts/draft_logprobs [B, 0],
    routing [L, B, 1, k]."""
    c = spec.cfg
    phase, tok = state["phase"], state["tok"]
    gen, fed = phase == 1, phase > 0
    logits, aux = forward(
        params, tok[:, None], c, cache=state["cache"], kv_len=kv_len, mesh=spec.layout
    )
    cache = aux["cache"]
    cache["pos"] = state["cache"]["pos"] + fed
    logp = sampling.sampling_logprobs(
        logits[:, 0], state["temperature"], state["top_k"], state["top_p"]
    )
    new = sampling.sample_rows(
        lambda: _row_keys(base_key, state["rid"], state["n_gen"]), logp, state["temperature"]
    )
    is_stop = (new[:, None] == state["stop_ids"]).any(-1)
    budget = state["budget"] - gen
    stopped = gen & (is_stop | (budget <= 0))
    phase_next = jnp.where(
        phase == 2, 0, jnp.where(stopped, jnp.where(state["pause"], 0, 2), phase)
    )
    state = dict(
        state,
        cache=cache,
        tok=jnp.where(gen, new, tok),
        phase=phase_next,
        n_gen=state["n_gen"] + gen,
        budget=budget,
    )
    out = {
        "tokens": new[:, None],
        "logprobs": sampling.take(logp, new)[:, None],
        "n_emit": gen.astype(jnp.int32),
        "n_fed": fed.astype(jnp.int32),
        "accepted": jnp.zeros_like(tok),
        "drafts": jnp.zeros((tok.shape[0], 0), jnp.int32),
        "draft_logprobs": jnp.zeros((tok.shape[0], 0), jnp.float32),
        "routing": _routing(aux, c, tok.shape[0], 1),
        "phase": phase_next,
    }
    return state, out


def _draft_logits(params, g, c: ModelConfig):
    return lm_head(params, rms_norm(g, mtp_params(params, 0)["norm"], c.rms_norm_eps), c)[:, 0]


def _spec_step(params, state: dict, base_key, spec: StepSpec, kv_len):
    """Draft K tokens with MTP module 0 (the first from the main model's hidden state, the
    rest chained on the module's own, as EAGLE and SGLang's NextN do), verify them with the
    main model in one forward pass over K+1 tokens, keep the accepted prefix plus one
    corrected/bonus token. The kept tokens' MTP entries are written by the next step's first
    module pass (deferred: no extra pass)."""
    c, K, B = spec.cfg, spec.num_draft, spec.n_slots
    phase, tok = state["phase"], state["tok"]
    temp, top_k, top_p = state["temperature"], state["top_k"], state["top_p"]
    gen, flush = phase == 1, phase == 2
    n_B = state["cache"]["pos"]
    keys = jax.vmap(lambda k: jax.random.split(k, K + 1))(
        _row_keys(base_key, state["rid"], state["n_gen"])
    )

    # Draft 1 from the deferred entries (the pending token completes them), then a chain.
    pending = jnp.maximum(state["mtp_n"] - 1, 0)
    mtp_tok = state["mtp_tok"].at[jnp.arange(B), pending].set(tok)
    g, mtp = _catch_up(
        params, state["mtp_cache"], state["mtp_h"], mtp_tok, state["mtp_n"], n_B, spec, kv_len
    )
    drafts, draft_logps = [], []
    for j in range(K):
        if j:
            mtp["pos"] = n_B + j - 1
            prev = drafts[-1][:, None]
            g, mtp = mtp_module(
                params,
                0,
                g,
                prev,
                c,
                positions=mtp["pos"][:, None],
                cache=mtp,
                kv_len=kv_len,
                mesh=spec.layout,
            )
        lp = sampling.sampling_logprobs(_draft_logits(params, g, c), temp, top_k, top_p)
        d = sampling.sample(keys[:, j], lp, temp)
        drafts.append(d)
        draft_logps.append(lp)
    mtp.pop("pos")
    drafts_BK = jnp.stack(drafts, 1)

    verify_BT = jnp.concatenate([tok[:, None], drafts_BK], 1)
    logits, aux = forward(
        params,
        verify_BT,
        c,
        cache=state["cache"],
        return_hidden=True,
        kv_len=kv_len,
        mesh=spec.layout,
    )
    V = logits.shape[-1]
    rep = lambda x: jnp.repeat(x, K + 1)  # noqa: E731
    target_BKV = sampling.sampling_logprobs(
        logits.reshape(B * (K + 1), V), rep(temp), rep(top_k), rep(top_p)
    ).reshape(B, K + 1, V)
    accepted, bonus = sampling.speculative_accept(
        keys[:, K], target_BKV, jnp.stack(draft_logps, 1), drafts_BK, temp
    )

    idx = jnp.arange(K + 1)[None]
    cand_BT = jnp.where(
        idx < accepted[:, None], jnp.pad(drafts_BK, ((0, 0), (0, 1))), bonus[:, None]
    )
    n_cand = accepted + 1
    is_stop = (cand_BT[..., None] == state["stop_ids"][:, None]).any(-1) & (idx < n_cand[:, None])
    first_stop = jnp.where(is_stop.any(1), jnp.argmax(is_stop, 1) + 1, K + 2)
    n_emit = jnp.where(gen, jnp.minimum(jnp.minimum(n_cand, state["budget"]), first_stop), 0)
    budget = state["budget"] - n_emit
    stopped = gen & ((first_stop <= n_emit) | (budget <= 0))
    last_fed = n_emit <= accepted  # the last emitted token is a verified draft
    n_fed = jnp.where(gen, 1 + jnp.minimum(accepted, n_emit), flush.astype(jnp.int32))
    phase_next = jnp.where(
        flush, 0, jnp.where(stopped, jnp.where(state["pause"] | last_fed, 0, 2), phase)
    )

    # The fed tokens' entries are deferred to the next pass: hidden states of verified
    # positions 0..n_fed-1 and the tokens after them (the emitted ones).
    fed_rows = (n_fed > 0)[:, None]
    mtp_h = jnp.where(fed_rows[..., None], aux["hidden"], state["mtp_h"])
    mtp_tok = jnp.where(fed_rows, cand_BT, state["mtp_tok"])
    mtp_n = jnp.where(n_fed > 0, n_fed, state["mtp_n"])
    cache = aux["cache"]
    cache["pos"] = n_B + n_fed
    state = dict(
        state,
        cache=cache,
        mtp_cache=mtp,
        mtp_h=mtp_h,
        mtp_tok=mtp_tok,
        mtp_n=mtp_n,
        tok=jnp.where(gen, bonus, tok),
        phase=phase_next,
        n_gen=state["n_gen"] + n_emit,
        budget=budget,
    )
    out = {
        "tokens": cand_BT,
        "logprobs": jnp.take_along_axis(target_BKV, cand_BT[..., None], -1)[..., 0],
        "n_emit": n_emit,
        "n_fed": n_fed,
        "accepted": jnp.where(gen, accepted, 0),
        "drafts": drafts_BK,
        "draft_logprobs": jnp.take_along_axis(jnp.stack(draft_logps, 1), drafts_BK[..., None], -1)[
            ..., 0
        ],
        "routing": _routing(aux, c, B, K + 1),
        "phase": phase_next,
    }
    return state, out


@functools.partial(jax.jit, static_argnames=("spec", "kv_len"), donate_argnames=("state",))
def decode(params, state: dict, base_key, spec: StepSpec, kv_len: int | None = None):
    """`spec.steps_per_call` batched steps; outputs stacked on a leading step axis. Unrolled, not
    a lax.scan: XLA:CPU cannot run bf16 x bf16 -> f32 dots inside a loop body. `kv_len`: attend
    only to the caches' first kv_len slots (`attend_len`)."""
    step = _spec_step if spec.speculative else _plain_step
    outs = []
    for _ in range(spec.steps_per_call):
        state, out = step(params, state, base_key, spec, kv_len)
        outs.append(out)
    state = constrain_state(state, spec.layout)
    return state, jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
