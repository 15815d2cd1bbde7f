"""The RL objective as pure, jit-able functions, each choice registered by name.

The recipe's RL loss: docs/recipe.md §2.
"""

from c2.rl.objectives.advantages import ADVANTAGE_ESTIMATORS, group_advantages
from c2.rl.objectives.aggregation import (
    AGGREGATIONS,
    aggregate_loss,
    loss_normalizers,
    token_weights,
)
from c2.rl.objectives.kl import (
    KL_ESTIMATORS,
    KL_PLACEMENTS,
    kl_estimate,
    kl_token_loss,
    sequence_kl,
)
from c2.rl.objectives.length_penalty import EFFORT_TERMS, EffortWeights, effort, length_penalty
from c2.rl.objectives.loss import (
    ObjectiveConfig,
    objective_advantages,
    objective_mismatch_filter,
    rl_loss,
)
from c2.rl.objectives.mismatch import MISMATCH_LEVELS, mismatch_filter
from c2.rl.objectives.policy_gradient import (
    IMPORTANCE_CORRECTIONS,
    IMPORTANCE_LEVELS,
    importance_weights,
    policy_gradient_loss,
)
from c2.rl.objectives.registry import Registry
from c2.rl.objectives.rewards import REWARD_SIGNS, combine_rewards, reward_weight

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGGREGATIONS",
    "EFFORT_TERMS",
    "IMPORTANCE_CORRECTIONS",
    "IMPORTANCE_LEVELS",
    "KL_ESTIMATORS",
    "KL_PLACEMENTS",
    "MISMATCH_LEVELS",
    "REWARD_SIGNS",
    "EffortWeights",
    "ObjectiveConfig",
    "Registry",
    "aggregate_loss",
    "combine_rewards",
    "effort",
    "group_advantages",
    "importance_weights",
    "kl_estimate",
    "kl_token_loss",
    "length_penalty",
    "loss_normalizers",
    "mismatch_filter",
    "objective_advantages",
    "objective_mismatch_filter",
    "policy_gradient_loss",
    "reward_weight",
    "rl_loss",
    "sequence_kl",
    "token_weights",
]
