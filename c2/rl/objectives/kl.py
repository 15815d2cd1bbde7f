"""KL estimators on sampled tokens and where they apply (docs/recipe.md §2: k1, in the reward).

With r = pi_ref / pi_theta on the sampled token (log r = ref_logp - logp):
  k1 = -log r             unbiased for KL(pi_theta || pi_ref); as a loss its expected gradient is 0
  k2 = (log r)^2 / 2      biased; as a loss its expected gradient is that of KL(pi_theta || pi_ref)
  k3 = r - 1 - log r      unbiased, never negative; variance grows like E[r^2] as pi_theta drifts,
                          and as a loss its expected gradient is that of KL(pi_ref || pi_theta)
Placement: "reward" subtracts beta * sum_t k (stop-gradient) from each sample's return, so the
policy gradient carries it; "loss" adds beta * k to each token's loss (differentiable, ablation).
"""

import jax
import jax.numpy as jnp

from c2.rl.objectives.registry import Registry, check_tokens, f32, masked

KL_ESTIMATORS = Registry("kl_kind")
KL_PLACEMENTS = ("reward", "loss")


@KL_ESTIMATORS.register("k1")
def k1(log_r):
    return -log_r


@KL_ESTIMATORS.register("k2")
def k2(log_r):
    return 0.5 * jnp.square(log_r)


@KL_ESTIMATORS.register("k3")
def k3(log_r):
    # Near r = 1, r - 1 - log r cancels to nothing in float32: use its series x^2/2 + x^3/6 + ...
    x = log_r
    series = x * x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x / 120.0)))
    return jnp.where(jnp.abs(x) < 1e-2, series, jnp.expm1(x) - x)


def kl_estimate(logp, ref_logp, kind: str) -> jnp.ndarray:
    """Per-token KL estimate of the given kind, float32, differentiable in both logprobs."""
    estimator = KL_ESTIMATORS.get(kind)
    logp, ref_logp = f32(logp), f32(ref_logp)
    if logp.shape != ref_logp.shape:
        raise ValueError(f"logp {logp.shape} and ref_logp {ref_logp.shape} must have one shape")
    return estimator(ref_logp - logp)


def sequence_kl(logp_BT, ref_logp_BT, mask_BT, kind: str = "k1") -> jnp.ndarray:
    """Per-sample KL estimate summed over valid tokens, stop-gradient: the `reward` placement.

    The sum over a sample's tokens estimates the sequence-level KL(pi_theta || pi_ref); subtracted
    (times beta) from the return, its REINFORCE gradient is the gradient of that KL.
    """
    check_tokens(mask_BT, logp_BT=logp_BT, ref_logp_BT=ref_logp_BT)
    kl_BT = kl_estimate(masked(logp_BT, mask_BT), masked(ref_logp_BT, mask_BT), kind)
    return jax.lax.stop_gradient(kl_BT.sum(-1))


def kl_token_loss(logp_BT, ref_logp_BT, mask_BT, kind: str, beta: float) -> jnp.ndarray:
    """beta * k per valid token, differentiable: the `loss` placement (an ablation)."""
    check_tokens(mask_BT, logp_BT=logp_BT, ref_logp_BT=ref_logp_BT)
    kl_BT = kl_estimate(masked(logp_BT, mask_BT), masked(ref_logp_BT, mask_BT), kind)
    return f32(beta) * kl_BT
