"""Train-inference mismatch filter (docs/recipe.md §2, beside MoE router replay).

Per valid token, d = |log pi_train - log pi_infer|. Tokens (level="token") or whole samples
(level="sample", scored by their largest d) above a fixed threshold (nats), or above a quantile
of this batch's values (the report targets the p99), or either when both are given, are dropped.
The quantile is over the batch given: call the filter once per step on the whole batch, then
split the returned mask into micro-batches.
"""

import jax.numpy as jnp

from c2.rl.objectives.registry import check_choice, check_number, check_tokens, f32, masked

MISMATCH_LEVELS = ("token", "sample")


def _masked_quantile(x, valid, q):
    return jnp.nanquantile(jnp.where(valid, x, jnp.nan), q)


def mismatch_filter(
    train_logp_BT,
    infer_logp_BT,
    mask_BT,
    *,
    level: str = "token",
    threshold: float | None = None,
    quantile: float | None = None,
):
    """Returns (keep_BT, stats): the mask with mismatched tokens/samples removed, and statistics.

    With neither `threshold` nor `quantile` nothing is dropped (statistics only). stats: mean,
    p50, p99 and max of d over valid tokens, the limit applied (the smaller of the two), and the
    fractions of valid tokens and of samples that lost any token (all of them at level="sample").
    """
    check_choice("mismatch_level", level, MISMATCH_LEVELS)
    check_tokens(mask_BT, train_logp_BT=train_logp_BT, infer_logp_BT=infer_logp_BT)
    check_number("mismatch_threshold", threshold, low=0.0)
    check_number("mismatch_quantile", quantile, low=0.0, high=1.0, low_open=True)
    valid_BT = f32(mask_BT) > 0
    d_BT = jnp.abs(masked(train_logp_BT, valid_BT) - masked(infer_logp_BT, valid_BT))
    valid_B = valid_BT.any(-1)
    score_B = d_BT.max(-1)  # d >= 0 and padding is 0, so this is the max over valid tokens

    if level == "token":
        score, valid = d_BT, valid_BT
    else:
        score, valid = score_B, valid_B
    limit = jnp.float32(jnp.inf)
    if threshold is not None:
        limit = f32(threshold)
    if quantile is not None:
        limit = jnp.minimum(limit, _masked_quantile(score, valid, quantile))
    drop = valid & (score > limit)
    drop_BT = drop if level == "token" else drop[:, None] & valid_BT
    keep_BT = valid_BT & ~drop_BT

    n_tokens = jnp.maximum(valid_BT.sum(), 1)
    stats = {
        "mismatch_mean": d_BT.sum() / n_tokens,
        "mismatch_p50": _masked_quantile(d_BT, valid_BT, 0.5),
        "mismatch_p99": _masked_quantile(d_BT, valid_BT, 0.99),
        "mismatch_max": d_BT.max(),
        "mismatch_threshold": limit,
        "frac_tokens_dropped": drop_BT.sum() / n_tokens,
        "frac_samples_with_drops": drop_BT.any(-1).sum() / jnp.maximum(valid_B.sum(), 1),
    }
    return keep_BT, stats
