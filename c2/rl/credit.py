"""What the RL step decides on the whole batch before any gradient (docs/recipe.md §2, the RL
objective): which tokens the mismatch filter keeps, each chain's reward, the advantages by chain
and group, and the group counts. Pure functions of the batch (c2.rl.batching), traced inside the
learner's jitted update (c2.rl.step).

Units: a row is a segment, a chain is a sample (one episode, however many segments), a group is
`group_size` consecutive chains of one prompt. A chain takes part in its group's baseline when it
is present (`chain_valid`) and has a valid row: a failed sample (c2.rl.batching's
FAILED_STOP_REASONS) has none, so it neither trains nor moves the others' advantages. A group
with fewer than 2 such chains has no baseline: every advantage in it is 0, and it is counted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from c2.rl.objectives import ObjectiveConfig, mismatch_filter, objective_advantages

MISMATCH_TOKENS = ("fresh", "all")
MIN_GROUP = 2  # valid samples a group needs for a baseline (one sample has nothing to compare)


def mismatch_keep(objective: ObjectiveConfig, judged: str, batch, logp_BT, mask_BT, step):
    """(keep_BT, stats): the objective's mismatch filter on the step's tokens.

    The quantile (the recipe's p99) ranks the tokens `judged` names: "fresh" (sampled by the
    weights being updated, `target_versions == step`) or "all"; ranking older tokens would rank
    the policy's own drift since they were sampled, not train/inference numerics. The threshold
    (nats) judges every token whatever its version: no drift of a few updates comes near it, and a
    token beyond it is broken (routing, kernels, a corrupt record). The statistics describe every
    token.
    """
    obj, behaviour_BT = objective, batch["behaviour_logp"]
    level = obj.mismatch_level
    _, stats = mismatch_filter(logp_BT, behaviour_BT, mask_BT, level=level)
    fresh_BT = mask_BT & (batch["target_versions"] == step)
    judged_BT = mask_BT if judged == "all" else fresh_BT
    keep_BT = mask_BT
    if obj.mismatch_quantile is not None:
        keep_q_BT, q = mismatch_filter(
            logp_BT, behaviour_BT, judged_BT, level=level, quantile=obj.mismatch_quantile
        )
        keep_BT = keep_BT & (keep_q_BT | ~judged_BT)
        stats["mismatch_quantile_limit"] = q["mismatch_threshold"]  # NaN: no token judged
    if obj.mismatch_threshold is not None:
        keep_t_BT, _ = mismatch_filter(
            logp_BT, behaviour_BT, mask_BT, level=level, threshold=obj.mismatch_threshold
        )
        keep_BT = keep_BT & keep_t_BT
    drop_BT = mask_BT & ~keep_BT
    n_tokens = jnp.maximum(mask_BT.sum(), 1)
    stats |= {
        "frac_tokens_dropped": drop_BT.sum() / n_tokens,
        "frac_samples_with_drops": drop_BT.any(-1).sum() / jnp.maximum(mask_BT.any(-1).sum(), 1),
        "frac_tokens_fresh": fresh_BT.sum() / n_tokens,
    }
    stats.pop("mismatch_threshold")  # the no-limit filter's (inf): not a limit applied
    return keep_BT, stats


def chain_rewards(total_B, per_segment_B, valid_B, chain_B, num_chains: int):
    """(reward_C, valid rows per chain n_C). A chain's segments each carry the chain's terms
    (task, behaviour, penalties, length), counted once (their mean); `per_segment_B` is the
    part each segment earns itself (the KL term, over its own tokens), summed: a K-segment chain
    pays the KL of all its tokens, as the same tokens in one segment would."""
    w_B = valid_B.astype(jnp.float32)
    n_C = jax.ops.segment_sum(w_B, chain_B, num_segments=num_chains)
    shared_C = jax.ops.segment_sum((total_B - per_segment_B) * w_B, chain_B, num_chains)
    own_C = jax.ops.segment_sum(per_segment_B * w_B, chain_B, num_segments=num_chains)
    return shared_C / jnp.maximum(n_C, 1.0) + own_C, n_C


def chain_advantages(objective: ObjectiveConfig, total_B, per_segment_B, batch):
    """Advantage of every row: its chain's, from the configured estimator over each group's
    chains that take part (module doc); 0 on rows of chains that do not. Without segments
    (chain_B = arange(B)) this is the estimator on the rows."""
    valid_B, chain_B, chain_valid_C = batch["valid"], batch["chain"], batch["chain_valid"]
    reward_C, n_C = chain_rewards(total_B, per_segment_B, valid_B, chain_B, chain_valid_C.shape[0])
    adv_C = objective_advantages(objective, reward_C, chain_valid_C & (n_C > 0))
    return jnp.where(valid_B, adv_C[chain_B], 0.0)


def group_counts(group_size: int, task_B, batch) -> dict[str, jnp.ndarray]:
    """Per step: failed samples (present, nothing valid), groups with fewer than MIN_GROUP valid
    samples (no baseline, no advantage), and the fraction of groups whose valid samples' task
    rewards are all equal (`groups_zero_advantage`: no task signal to learn from; the other
    terms and the KL still move their advantages off 0)."""
    valid_B, chain_B, present_C = batch["valid"], batch["chain"], batch["chain_valid"]
    C = present_C.shape[0]
    w_B = valid_B.astype(jnp.float32)
    n_C = jax.ops.segment_sum(w_B, chain_B, num_segments=C)
    task_C = jax.ops.segment_max(jnp.where(valid_B, task_B, -jnp.inf), chain_B, num_segments=C)
    ok_GS = (present_C & (n_C > 0)).reshape(-1, group_size)
    task_GS = task_C.reshape(-1, group_size)
    present_G = present_C.reshape(-1, group_size).any(-1)
    few_G = present_G & (ok_GS.sum(-1) < MIN_GROUP)
    hi_G = jnp.where(ok_GS, task_GS, -jnp.inf).max(-1)
    lo_G = jnp.where(ok_GS, task_GS, jnp.inf).min(-1)
    flat_G = present_G & (few_G | (hi_G == lo_G))
    return {
        "failed_samples": (present_C & (n_C == 0)).sum().astype(jnp.float32),
        "groups_too_few_valid": few_G.sum().astype(jnp.float32),
        "groups_zero_advantage": flat_G.sum() / jnp.maximum(present_G.sum(), 1),
    }
