"""Group advantages: each sample's reward against the others of its prompt (docs/recipe.md §2).

Rewards are laid out group after group: rewards_B[g * group_size + i] is sample i of prompt g.
`valid_B` marks real samples (a padded or failed rollout is invalid): it is left out of its
group's statistics and gets advantage 0.
"""

import chex
import jax.numpy as jnp

from c2.rl.objectives.registry import Registry, check_number, f32, masked

ADVANTAGE_ESTIMATORS = Registry("advantage")


def _groups(rewards_B, group_size: int, valid_B):
    chex.assert_rank(rewards_B, 1, custom_message="rewards_B must be [batch]")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size={group_size!r} must be a positive int")
    (batch,) = rewards_B.shape
    if batch % group_size:
        raise ValueError(
            f"rewards_B has {batch} samples, not a multiple of group_size={group_size} "
            "(rewards are laid out group after group)"
        )
    if valid_B is None:
        valid_B = jnp.ones_like(rewards_B, dtype=bool)
    chex.assert_shape(valid_B, rewards_B.shape, custom_message="valid_B must match rewards_B")
    v_GS = f32(valid_B).reshape(-1, group_size)
    return masked(rewards_B, valid_B).reshape(-1, group_size), v_GS


def _std(r_GS, v_GS, mean_G1):
    """Sample std (ddof=1) over the group's valid samples, as GRPO's reference code (torch.std)."""
    n_G1 = v_GS.sum(-1, keepdims=True)
    var_G1 = (v_GS * (r_GS - mean_G1) ** 2).sum(-1, keepdims=True) / jnp.maximum(n_G1 - 1, 1)
    return jnp.sqrt(var_G1)


def group_advantages(
    rewards_B,
    group_size: int,
    normalize_std: bool = False,
    *,
    baseline: str = "mean",
    valid_B=None,
    eps: float = 1e-6,
) -> jnp.ndarray:
    """Reward minus a group baseline; optionally divided by the group std (original GRPO).

    baseline="mean": the group mean (the recipe's choice, with normalize_std=False).
    baseline="leave_one_out": the mean of the *other* valid samples of the group (RLOO), which
      keeps the policy gradient unbiased (the plain mean shrinks it by (G-1)/G).
    A group with a single valid sample gets advantage 0.
    """
    check_number("eps", eps, low=0.0)
    if baseline not in ("mean", "leave_one_out"):
        raise ValueError(f"baseline={baseline!r} is not one of ['leave_one_out', 'mean']")
    r_GS, v_GS = _groups(rewards_B, group_size, valid_B)
    n_G1 = v_GS.sum(-1, keepdims=True)
    sum_G1 = r_GS.sum(-1, keepdims=True)
    mean_G1 = sum_G1 / jnp.maximum(n_G1, 1)
    if baseline == "mean":
        adv_GS = r_GS - mean_G1
    else:
        adv_GS = r_GS - (sum_G1 - r_GS) / jnp.maximum(n_G1 - 1, 1)
    if normalize_std:
        adv_GS = adv_GS / (_std(r_GS, v_GS, mean_G1) + eps)
    adv_GS = jnp.where((v_GS > 0) & (n_G1 > 1), adv_GS, 0.0)
    return adv_GS.reshape(-1)


@ADVANTAGE_ESTIMATORS.register("group_mean")
def group_mean(rewards_B, group_size, valid_B=None):
    """The recipe's default: reward - group mean, no std normalisation."""
    return group_advantages(rewards_B, group_size, valid_B=valid_B)


@ADVANTAGE_ESTIMATORS.register("group_mean_std")
def group_mean_std(rewards_B, group_size, valid_B=None):
    """Original GRPO, for ablation: (reward - group mean) / group std."""
    return group_advantages(rewards_B, group_size, normalize_std=True, valid_B=valid_B)


@ADVANTAGE_ESTIMATORS.register("leave_one_out")
def leave_one_out(rewards_B, group_size, valid_B=None):
    """RLOO: reward - mean of the group's other samples."""
    return group_advantages(rewards_B, group_size, baseline="leave_one_out", valid_B=valid_B)
