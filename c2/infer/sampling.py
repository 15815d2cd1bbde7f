"""Sampling: temperature, top-k, top-p, greedy; the behaviour distribution's logprobs; the
speculative-decoding acceptance rule.

Every function works on a batch of rows, each with its own settings ([B] arrays), so one compiled
step serves requests with different sampling options. The behaviour distribution of a sampling
row is softmax(filter(logits / temperature)) with top-k applied before top-p (the order
transformers uses). A greedy row (temperature 0) has a point mass as its sampling distribution;
its recorded logprob is the model's own, log_softmax(logits), which is what the trainer recomputes.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def validate(self, vocab_size: int) -> SamplingParams:
        t, p, k = self.temperature, self.top_p, self.top_k
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature={t!r}: expected a finite number >= 0 (0 is greedy)")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"top_p={p!r}: expected a number in (0, 1]")
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= vocab_size:
            raise ValueError(f"top_k={k!r}: expected an int in [0, vocab_size={vocab_size}]")
        return self


def _filter_top_k_top_p(scaled_BV: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array):
    """Mask (to -inf) the tokens outside each row's top-k, then outside its top-p nucleus.

    Both filters keep a prefix of the row sorted by value, so the kept set is every token at or
    above the prefix's smallest value: the sort finds that threshold, and the mask is a compare
    with it, not a scatter back through the sort's permutation (XLA's partitioner cannot keep a
    [B, V] scatter's rows sharded: it would gather the RL trainer's log-prob chunks whole onto
    every device). A token tied with the threshold is kept, as transformers' top-k keeps it."""
    V = scaled_BV.shape[-1]
    sorted_BV = -jnp.sort(-scaled_BV, axis=-1)
    rank_V = jnp.arange(V)
    keep_BV = (top_k_B[:, None] == 0) | (rank_V[None] < top_k_B[:, None])
    probs_BV = jax.nn.softmax(jnp.where(keep_BV, sorted_BV, -jnp.inf), axis=-1)
    mass_before_BV = jnp.cumsum(probs_BV, axis=-1) - probs_BV
    # The smallest prefix holding top_p of the mass; top_p=1 keeps everything exactly.
    keep_BV &= (top_p_B[:, None] >= 1.0) | (mass_before_BV < top_p_B[:, None])
    threshold_B1 = jnp.min(jnp.where(keep_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(scaled_BV >= threshold_B1, scaled_BV, -jnp.inf)


def sampling_logprobs(
    logits_BV: jax.Array, temperature_B: jax.Array, top_k_B: jax.Array, top_p_B: jax.Array
) -> jax.Array:
    """Log-probabilities [B, V] float32 of each row's behaviour distribution (see module doc)."""
    logits_BV = logits_BV.astype(jnp.float32)
    greedy_B = temperature_B <= 0
    scaled_BV = logits_BV / jnp.where(greedy_B, 1.0, temperature_B)[:, None]
    needs_filter = jnp.any(~greedy_B & ((top_k_B > 0) | (top_p_B < 1.0)))
    filtered_BV = jax.lax.cond(
        needs_filter,
        lambda x: _filter_top_k_top_p(x, jnp.where(greedy_B, 0, top_k_B), top_p_B),
        lambda x: x,
        scaled_BV,
    )
    filtered_BV = jnp.where(greedy_B[:, None], scaled_BV, filtered_BV)
    return jax.nn.log_softmax(filtered_BV, axis=-1)


def inverse_cdf(u_B: jax.Array, weights_BV: jax.Array) -> jax.Array:
    """[B] int32: for each row the first index whose cumulative weight reaches (1 - u) of the
    row's total, u in [0, 1): a draw from weights_BV (non-negative, unnormalised) for uniform
    u. A zero-weight index is never drawn (its cumulative weight equals its predecessor's)."""
    cdf_BV = jnp.cumsum(weights_BV.astype(jnp.float32), axis=-1)
    x_B = (1.0 - u_B) * cdf_BV[:, -1]  # in (0, total]
    drawn_B = jnp.sum(cdf_BV < x_B[:, None], axis=-1)
    return jnp.minimum(drawn_B, weights_BV.shape[-1] - 1).astype(jnp.int32)


def categorical(key_B: jax.Array, weights_BV: jax.Array) -> jax.Array:
    """One draw per row from weights_BV with its own key: one uniform per row (the CDF
    inverted), where `jax.random.categorical`'s Gumbel trick needs one per vocabulary entry:
    the random bits were a tenth of a decode call on the CPU."""
    return inverse_cdf(jax.vmap(jax.random.uniform)(key_B), weights_BV)


def greedy(logits_BV: jax.Array) -> jax.Array:
    """int32 over the leading axes: each row's first index of its maximum, as `jnp.argmax` (a
    row holding a NaN gives its last index). A max, then a min over the indices that match it:
    argmax's variadic reduce was ~4x slower on XLA:CPU ([32, 320]: ~60 us of a ~2.7 ms decode
    call)."""
    V = logits_BV.shape[-1]
    top_B1 = logits_BV.max(-1, keepdims=True)
    return jnp.min(jnp.where(logits_BV == top_B1, jnp.arange(V, dtype=jnp.int32), V - 1), -1)


def sample(key_B: jax.Array, logp_BV: jax.Array, temperature_B: jax.Array) -> jax.Array:
    """One token per row [B] int32: argmax for greedy rows, a draw from logp_BV otherwise."""
    drawn_B = categorical(key_B, jnp.exp(logp_BV))
    return jnp.where(temperature_B <= 0, greedy(logp_BV), drawn_B).astype(jnp.int32)


def sample_rows(keys_fn, logp_BV: jax.Array, temperature_B: jax.Array) -> jax.Array:
    """`sample` with the row keys made by keys_fn() only when some row samples: a greedy batch
    draws no random bits (deriving the keys, threefry in rolled loops on the CPU, was ~0.1 ms
    of a 2.7 ms batch-32 decode call). The same tokens either way."""
    return jax.lax.cond(
        jnp.any(temperature_B > 0),
        lambda: sample(keys_fn(), logp_BV, temperature_B),
        lambda: greedy(logp_BV),
    )


def take(logp_BV: jax.Array, tokens_B: jax.Array) -> jax.Array:
    return jnp.take_along_axis(logp_BV, tokens_B[:, None], axis=-1)[:, 0]


def speculative_accept(
    key_B: jax.Array,
    target_logp_BKV: jax.Array,
    draft_logp_BKV: jax.Array,
    drafts_BK: jax.Array,
    temperature_B: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The speculative rejection rule (Leviathan et al. 2023; Chen et al. 2023).

    target_logp [B, K+1, V]: the main model's behaviour distribution at the K+1 verified
    positions (position i predicts the token after draft i); draft_logp [B, K, V]: the
    distributions the K drafts were drawn from. Draft i is kept with probability
    min(1, p_i(d)/q_i(d)); at the first rejection the next token is drawn from
    normalise(max(0, p - q)); when all K are kept, a bonus token is drawn from p_K. The emitted
    tokens are then distributed exactly as sampling from p token by token. Greedy rows keep a
    draft while it equals the target argmax and emit the target argmax at the first mismatch.
    Returns (accepted count [B] in [0, K], next token [B]).
    """
    B, K1, V = target_logp_BKV.shape
    K = K1 - 1
    keys = jax.vmap(lambda k: jax.random.split(k, 2))(key_B)  # [B, 2]
    u_BK = jax.vmap(lambda k: jax.random.uniform(k, (K,)))(keys[:, 0])
    greedy_B = temperature_B <= 0
    rows = jnp.arange(B)[:, None]
    pos_K = jnp.arange(K)[None]
    p_d_BK = target_logp_BKV[rows, pos_K, drafts_BK]
    q_d_BK = draft_logp_BKV[rows, pos_K, drafts_BK]
    sampled_ok_BK = jnp.log(u_BK) <= p_d_BK - q_d_BK
    greedy_ok_BK = drafts_BK == greedy(target_logp_BKV[:, :K])
    ok_BK = jnp.where(greedy_B[:, None], greedy_ok_BK, sampled_ok_BK)
    accepted_B = jnp.sum(jnp.cumprod(ok_BK.astype(jnp.int32), axis=1), axis=1)

    p_BV = jnp.exp(target_logp_BKV[jnp.arange(B), accepted_B])
    q_pad_BKV = jnp.concatenate([draft_logp_BKV, jnp.full((B, 1, V), -jnp.inf)], axis=1)
    q_BV = jnp.exp(q_pad_BKV[jnp.arange(B), accepted_B])  # zero after the last draft: bonus
    residual_BV = jnp.maximum(p_BV - q_BV, 0.0)
    empty_B = residual_BV.sum(-1) <= 0  # p == q: the residual is empty, p itself is exact
    residual_BV = jnp.where(empty_B[:, None], p_BV, residual_BV)
    drawn_B = categorical(keys[:, 1], residual_BV)
    greedy_next_B = greedy(target_logp_BKV[jnp.arange(B), accepted_B])
    next_B = jnp.where(greedy_B, greedy_next_B, drawn_B).astype(jnp.int32)
    return accepted_B, next_B
