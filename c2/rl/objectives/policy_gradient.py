"""Policy-gradient token loss with the behaviour policy's logprobs (docs/recipe.md §2, async RL).

Samples come from the inference engine (the behaviour policy mu, possibly a few weight versions
old, and numerically different from the trainer even at the same version). Three logprobs:
  logp_BT            the trainer's, now (differentiated)
  old_logp_BT        the trainer's at the start of the step (PPO epochs); default stop_grad(logp_BT)
  behaviour_logp_BT  the inference engine's, recorded with the sample
Token loss = -is_weight * A * ratio, with ratio = pi / pi_old (value 1 in a single-epoch step,
gradient grad log pi) and is_weight = pi_old / mu corrected by a registered rule:
  none  is_weight = 1 (on-policy assumption)
  tis   truncated importance sampling: min(pi_old / mu, cap)
  mis   masked importance sampling: pi_old / mu inside [low, high]; the token is dropped outside
`level="sequence"` uses one ratio per sample (the product over its tokens) instead of per token.
Optional PPO clipping (multi-epoch ablations): -is_weight * min(ratio A, clip(ratio, 1-lo, 1+hi) A).
"""

import chex
import jax
import jax.numpy as jnp

from c2.rl.objectives.registry import (
    Registry,
    check_choice,
    check_number,
    check_tokens,
    f32,
    masked,
)

IMPORTANCE_CORRECTIONS = Registry("importance_correction")
IMPORTANCE_LEVELS = ("token", "sequence")


@IMPORTANCE_CORRECTIONS.register("none")
def _none(ratio_BT, *, cap, low, high):
    del cap, low, high
    return jnp.ones_like(ratio_BT), jnp.ones_like(ratio_BT, dtype=bool)


@IMPORTANCE_CORRECTIONS.register("tis")
def _tis(ratio_BT, *, cap, low, high):
    del low, high
    return jnp.minimum(ratio_BT, cap), jnp.ones_like(ratio_BT, dtype=bool)


@IMPORTANCE_CORRECTIONS.register("mis")
def _mis(ratio_BT, *, cap, low, high):
    del cap
    keep_BT = (ratio_BT >= low) & (ratio_BT <= high)
    return jnp.where(keep_BT, ratio_BT, 0.0), keep_BT


def importance_weights(
    old_logp_BT,
    behaviour_logp_BT,
    mask_BT,
    correction: str = "tis",
    *,
    level: str = "token",
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
):
    """Stop-gradient weights pi_old / mu after correction, and the tokens kept (MIS drops some).

    Returns (weight_BT, keep_BT, ratio_BT): weight is 0 on padding and on dropped tokens.
    """
    correct = IMPORTANCE_CORRECTIONS.get(correction)
    check_choice("importance_level", level, IMPORTANCE_LEVELS)
    check_number("tis_cap", cap, low=0.0, low_open=True)
    check_number("mis_low", low, low=0.0)
    check_number("mis_high", high, low=low if isinstance(low, float | int) else None)
    check_tokens(mask_BT, old_logp_BT=old_logp_BT, behaviour_logp_BT=behaviour_logp_BT)
    m_BT = f32(mask_BT)
    log_ratio_BT = masked(old_logp_BT, m_BT) - masked(behaviour_logp_BT, m_BT)
    if level == "sequence":
        log_ratio_BT = jnp.broadcast_to(log_ratio_BT.sum(-1, keepdims=True), m_BT.shape)
    ratio_BT = jax.lax.stop_gradient(jnp.exp(log_ratio_BT))
    weight_BT, keep_BT = correct(ratio_BT, cap=cap, low=low, high=high)
    keep_BT = keep_BT & (m_BT > 0)
    return jnp.where(keep_BT, weight_BT, 0.0), keep_BT, ratio_BT


def policy_gradient_loss(
    logp_BT,
    behaviour_logp_BT,
    advantages,
    mask_BT,
    *,
    old_logp_BT=None,
    correction: str = "tis",
    level: str = "token",
    tis_cap: float = 2.0,
    mis_low: float = 0.5,
    mis_high: float = 2.0,
    clip_low: float | None = None,
    clip_high: float | None = None,
):
    """Per-token policy-gradient loss [B, T] (zero on padding and dropped tokens), and metrics.

    `advantages` is [B] (one per sample, broadcast to its tokens, as for a chain's final reward)
    or [B, T]. Aggregate the result with `aggregate_loss`, using the *original* padding mask so
    MIS-dropped tokens still count in the normaliser (they are zeros, not absent samples).
    """
    check_tokens(mask_BT, logp_BT=logp_BT, behaviour_logp_BT=behaviour_logp_BT)
    chex.assert_rank(advantages, {1, 2}, custom_message="advantages must be [B] or [B, T]")
    adv_BT = f32(advantages)
    if adv_BT.ndim == 1:
        chex.assert_shape(adv_BT, mask_BT.shape[:1], custom_message="advantages must be [B]")
        adv_BT = jnp.broadcast_to(adv_BT[:, None], mask_BT.shape)
    else:
        check_tokens(mask_BT, advantages=adv_BT)
    adv_BT = jax.lax.stop_gradient(adv_BT)
    check_tokens(mask_BT, old_logp_BT=old_logp_BT)
    logp_BT = masked(logp_BT, mask_BT)
    old_BT = jax.lax.stop_gradient(logp_BT if old_logp_BT is None else masked(old_logp_BT, mask_BT))

    is_weight_BT, keep_BT, is_ratio_BT = importance_weights(
        old_BT, behaviour_logp_BT, mask_BT, correction,
        level=level, cap=tis_cap, low=mis_low, high=mis_high,
    )  # fmt: skip
    ratio_BT = jnp.exp(jnp.where(keep_BT, logp_BT - old_BT, 0.0))  # MIS-dropped: no gradient
    surrogate_BT = ratio_BT * adv_BT
    clipped_BT = jnp.zeros_like(keep_BT)
    if clip_low is not None or clip_high is not None:
        lo = 0.0 if clip_low is None else clip_low
        hi = jnp.inf if clip_high is None else clip_high
        check_number("clip_low", lo, low=0.0, high=1.0)
        check_number("clip_high", hi, low=0.0)
        clipped_surrogate_BT = jnp.clip(ratio_BT, 1.0 - lo, 1.0 + hi) * adv_BT
        clipped_BT = keep_BT & (clipped_surrogate_BT < surrogate_BT)
        surrogate_BT = jnp.minimum(surrogate_BT, clipped_surrogate_BT)
    token_loss_BT = jnp.where(keep_BT, -is_weight_BT * surrogate_BT, 0.0)

    m_BT = f32(mask_BT)
    n = jnp.maximum(m_BT.sum(), 1.0)
    metrics = {
        "is_ratio_mean": (is_ratio_BT * m_BT).sum() / n,
        "is_ratio_max": jnp.where(m_BT > 0, is_ratio_BT, 0.0).max(),
        "is_weight_mean": (is_weight_BT * m_BT).sum() / n,
        "frac_truncated": ((is_ratio_BT > tis_cap) & (m_BT > 0)).sum() / n
        if correction == "tis"
        else jnp.float32(0.0),
        "frac_masked_is": ((m_BT > 0) & ~keep_BT).sum() / n,
        "frac_clipped": clipped_BT.sum() / n,
    }
    return token_loss_BT, metrics
