"""Next-token cross-entropy, MTP self-distillation (docs/recipe.md §1) and bits per byte."""

from __future__ import annotations

import math

import chex
import jax
import jax.numpy as jnp


def token_nll_BT(logits_BTV: jax.Array, targets_BT: jax.Array) -> jax.Array:
    """-log p(target) per position, in nats, computed in float32."""
    chex.assert_equal_shape_prefix((logits_BTV, targets_BT), 2)
    logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp_BTV, targets_BT[..., None].astype(jnp.int32), axis=-1)[..., 0]


def next_token_loss(
    logits_BTV: jax.Array, targets_BT: jax.Array, loss_mask_BT: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Masked cross-entropy: (sum of nll / number of target tokens, nll sum, token count)."""
    mask_BT = loss_mask_BT.astype(jnp.float32)
    nll_sum = jnp.sum(token_nll_BT(logits_BTV, targets_BT) * mask_BT)
    n_tokens = jnp.sum(mask_BT)
    return nll_sum / jnp.maximum(n_tokens, 1.0), nll_sum, n_tokens


def mtp_valid_BT(segment_ids_BT: jax.Array, loss_mask_BT: jax.Array, depth: int) -> jax.Array:
    """Where the depth-`depth` MTP head at t has a teacher: the main head at t+depth.

    Valid when t+depth is in the same (non-padding) document as t and the teacher's own target
    (token t+depth+1) is a trained target. Shape [B, T-depth].
    """
    seg_now, seg_ahead = segment_ids_BT[:, :-depth], segment_ids_BT[:, depth:]
    same_doc = (seg_now == seg_ahead) & (seg_now != 0)
    return same_doc & (loss_mask_BT[:, depth:] > 0)


def _check_distill_kind(kind: str) -> None:
    if kind not in ("kl", "ce"):
        raise ValueError(f"config.train.mtp_distill: expected 'kl' or 'ce', got {kind!r}")


def _distill_terms(
    s_logits: jax.Array, t_logp: jax.Array, kind: str
) -> tuple[jax.Array, jax.Array]:
    """Per position: the student's distillation loss against the teacher's log-probabilities
    (cross-entropy, or KL(teacher||student) for kind "kl") and whether their argmaxes agree."""
    s_logp = jax.nn.log_softmax(s_logits, axis=-1)
    t_p = jnp.exp(t_logp)
    per_pos = -jnp.sum(t_p * s_logp, axis=-1)
    if kind == "kl":
        per_pos = per_pos + jnp.sum(t_p * t_logp, axis=-1)
    return per_pos, jnp.argmax(s_logits, -1) == jnp.argmax(t_logp, -1)


def mtp_distillation(
    mtp_logits_DBTV: jax.Array,
    logits_BTV: jax.Array,
    segment_ids_BT: jax.Array,
    loss_mask_BT: jax.Array,
    kind: str = "kl",
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """MTP self-distillation: the depth-d head at t matches the main head's distribution at t+d.

    The main head at t+d predicts token t+d+1, the same token the depth-d MTP head at t predicts,
    so its full distribution (stop-gradient) is the teacher. `kind` "kl" gives KL(teacher||mtp),
    "ce" the cross-entropy (same gradient, offset by the teacher's entropy). Returns the loss
    averaged over depths and per-depth metrics: distillation loss, acceptance (argmax agreement,
    i.e. greedy speculative-decoding acceptance) and the number of valid positions.
    """
    D, B, T, V = mtp_logits_DBTV.shape
    chex.assert_shape(logits_BTV, (B, T, V))
    chex.assert_shape((segment_ids_BT, loss_mask_BT), (B, T))
    _check_distill_kind(kind)
    teacher_logp_BTV = jax.nn.log_softmax(
        jax.lax.stop_gradient(logits_BTV).astype(jnp.float32), axis=-1
    )
    losses, metrics = [], {}
    for d in range(1, D + 1):
        if d >= T:
            raise ValueError(f"MTP depth {d} needs sequences longer than {T}")
        valid_BT = mtp_valid_BT(segment_ids_BT, loss_mask_BT, d).astype(jnp.float32)
        s_logits_BTV = mtp_logits_DBTV[d - 1, :, : T - d].astype(jnp.float32)
        per_pos_BT, agree_BT = _distill_terms(s_logits_BTV, teacher_logp_BTV[:, d:], kind)
        n_valid = jnp.sum(valid_BT)
        loss_d = jnp.sum(per_pos_BT * valid_BT) / jnp.maximum(n_valid, 1.0)
        accept_d = jnp.sum(agree_BT * valid_BT) / jnp.maximum(n_valid, 1.0)
        losses.append(loss_d)
        metrics[f"mtp{d}_loss"] = loss_d
        metrics[f"mtp{d}_acceptance"] = accept_d
        metrics[f"mtp{d}_positions"] = n_valid
    return jnp.mean(jnp.stack(losses)), metrics


def bits_per_byte(nll_sum_nats, n_bytes):
    """Total nll in nats over the bytes those targets stand for, in bits per byte."""
    return nll_sum_nats / (math.log(2.0) * jnp.maximum(n_bytes, 1))


def to_chunks(x_BT: jax.Array, chunk_tokens: int) -> jax.Array:
    """[B, T, ...] -> [T / chunk_tokens, B, chunk_tokens, ...]: chunk j holds positions
    t = c * (T / chunk_tokens) + j. Strided, so a sequence split over the `context` mesh axis
    gives every shard an equal slice of each chunk and the scan axis is never sharded."""
    B, T = x_BT.shape[:2]
    x = x_BT.reshape(B, chunk_tokens, T // chunk_tokens, *x_BT.shape[2:])
    return jnp.moveaxis(x, 2, 0)


def from_chunks(x_nBC: jax.Array) -> jax.Array:
    """The inverse of `to_chunks`: [n, B, C, ...] -> [B, C * n, ...]."""
    n, B, C = x_nBC.shape[:3]
    return jnp.moveaxis(x_nBC, 0, 2).reshape(B, C * n, *x_nBC.shape[3:])


def chunked_lm_sums(
    head,
    h_BTH: jax.Array,
    targets_BT: jax.Array,
    loss_mask_BT: jax.Array,
    chunk_tokens: int,
    *,
    mtp_h_DBTH: jax.Array | None = None,
    segment_ids_BT: jax.Array | None = None,
    kind: str = "kl",
) -> dict[str, jax.Array]:
    """The sums behind `next_token_loss` and `mtp_distillation`, the [B, T, V] float32 logits
    never whole: the LM head and the softmaxes run over `chunk_tokens` sequence positions at a
    time (every row of the batch at once) in a `lax.scan` whose body is rematerialised, so the
    forward keeps no logits and the backward recomputes one chunk's at a time.

    `head(h)` maps normed hidden states [..., H] to float32 logits [..., V]; `h_BTH` is the main
    model's final normed hidden state, `mtp_h_DBTH` the MTP modules' normed ones (depth d at t
    predicts what the main head at t+d does: the teacher is the main head applied to h at t+d,
    recomputed per chunk under stop_gradient, one head matmul per depth more than the unchunked
    path). The chunks are `to_chunks`'s (strided over the sequence). Returns nll_sum and tokens,
    and per depth d (1-based) mtp{d}_loss_sum, mtp{d}_accepted and mtp{d}_positions.
    """
    B, T, _ = h_BTH.shape
    chex.assert_shape((targets_BT, loss_mask_BT), (B, T))
    if chunk_tokens <= 0 or T % chunk_tokens:
        raise ValueError(
            f"config.train.loss_chunk_tokens={chunk_tokens}: must be > 0 and divide the sequence "
            f"length {T}"
        )
    _check_distill_kind(kind)
    mask_BT = loss_mask_BT.astype(jnp.float32)
    rows = {"h": h_BTH, "targets": targets_BT.astype(jnp.int32), "mask": mask_BT}
    depths = 0 if mtp_h_DBTH is None else mtp_h_DBTH.shape[0]
    if depths:
        chex.assert_shape(mtp_h_DBTH, (depths, B, T, h_BTH.shape[-1]))
        teacher_h_BTH = jax.lax.stop_gradient(h_BTH)
        for d in range(1, depths + 1):
            if d >= T:
                raise ValueError(f"MTP depth {d} needs sequences longer than {T}")
            # Row t holds the teacher at t+d; the last d rows have none (valid is False there).
            rows[f"teacher{d}"] = jnp.pad(teacher_h_BTH[:, d:], ((0, 0), (0, d), (0, 0)))
            rows[f"student{d}"] = mtp_h_DBTH[d - 1]
            rows[f"valid{d}"] = jnp.pad(
                mtp_valid_BT(segment_ids_BT, loss_mask_BT, d).astype(jnp.float32),
                ((0, 0), (0, d)),
            )

    def chunk_sums(r):
        out = {}
        nll_BC = token_nll_BT(head(r["h"]), r["targets"])
        out["nll_sum"] = jnp.sum(nll_BC * r["mask"])
        out["tokens"] = jnp.sum(r["mask"])
        for d in range(1, depths + 1):
            valid = r[f"valid{d}"]
            t_logp = jax.nn.log_softmax(jax.lax.stop_gradient(head(r[f"teacher{d}"])), axis=-1)
            per_pos, agree = _distill_terms(head(r[f"student{d}"]), t_logp, kind)
            out[f"mtp{d}_loss_sum"] = jnp.sum(per_pos * valid)
            out[f"mtp{d}_accepted"] = jnp.sum(agree * valid)
            out[f"mtp{d}_positions"] = jnp.sum(valid)
        return out

    @jax.checkpoint
    def body(acc, r):
        return jax.tree.map(jnp.add, acc, chunk_sums(r)), None

    chunks = jax.tree.map(lambda x: to_chunks(x, chunk_tokens), rows)
    zeros = jax.tree.map(
        lambda s: jnp.zeros((), s.dtype),
        jax.eval_shape(chunk_sums, jax.tree.map(lambda x: x[0], chunks)),
    )
    sums, _ = jax.lax.scan(body, zeros, chunks)
    return sums
