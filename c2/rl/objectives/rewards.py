"""Reward combination: task reward, behaviour rewards, penalties, KL (docs/recipe.md §2, rewards).

total_B = sum over given terms of sign * weight(step) * term_B, where rewards add and penalties
(given as non-negative magnitudes) subtract. Weights are numbers or schedules step -> weight
(e.g. `optax.schedules.linear_schedule`), since the report adjusts reward rules as behaviours
emerge. Every weighted term is returned too, for logging.
"""

from collections.abc import Callable, Mapping

import chex
import jax.numpy as jnp

from c2.rl.objectives.registry import f32

REWARD_SIGNS = {
    "task": 1.0,
    "style": 1.0,
    "communication": 1.0,
    "tool_call_penalty": -1.0,
    "length_penalty": -1.0,
    "kl": -1.0,
}

Weight = float | Callable[[jnp.ndarray], jnp.ndarray]


def reward_weight(weight: Weight, step) -> jnp.ndarray:
    """The weight at `step`: a number, or a schedule called with the step."""
    return f32(weight(step) if callable(weight) else weight)


def combine_rewards(
    terms: Mapping[str, jnp.ndarray], weights: Mapping[str, Weight], step=0
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """Returns (total_B, log): log["reward/<term>"] is the signed weighted term [B] and
    log["weight/<term>"] its weight at this step. Every term needs a weight ("task" defaults to 1);
    "kl" is the per-sample `sequence_kl` and its weight is beta (the `reward` placement)."""
    unknown = sorted(set(terms) - set(REWARD_SIGNS))
    if unknown:
        raise ValueError(f"reward terms {unknown} are not among {sorted(REWARD_SIGNS)}")
    if "task" not in terms:
        raise ValueError(f"reward terms must include 'task'; got {sorted(terms)}")
    extra = sorted(set(weights) - set(terms))
    if extra:
        raise ValueError(f"reward weights {extra} have no term among {sorted(terms)}")
    weights = {"task": 1.0, **weights}
    missing = sorted(set(terms) - set(weights))
    if missing:
        raise ValueError(f"reward terms {missing} have no weight (a number or a schedule)")
    arrays = {name: f32(value) for name, value in terms.items()}
    chex.assert_rank(list(arrays.values()), 1, custom_message="reward terms must each be [batch]")
    chex.assert_equal_shape(list(arrays.values()), custom_message="reward terms must share [batch]")

    total_B = jnp.zeros_like(arrays["task"])
    log = {}
    for name in REWARD_SIGNS:  # a fixed order: the same sum whatever the dict order
        if name not in arrays:
            continue
        w = reward_weight(weights[name], step)
        term_B = REWARD_SIGNS[name] * w * arrays[name]
        total_B = total_B + term_B
        log[f"reward/{name}"] = term_B
        log[f"weight/{name}"] = w
    log["reward/total"] = total_B
    return total_B, log
