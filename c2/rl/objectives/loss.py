"""The RL objective composed from its named parts; one static config holds every choice.

The train step calls, per optimiser step:
  keep_BT, stats = objective_mismatch_filter(cfg, train_logp_BT, behaviour_logp_BT, mask_BT)
  advantages_B   = objective_advantages(cfg, total_reward_B)   # total from combine_rewards
  loss, metrics  = rl_loss(cfg, logp_BT, behaviour_logp_BT, advantages_B, keep_BT, ...)
with the whole batch for the first two (groups and quantiles are batch-wide), and rl_loss per
micro-batch with the whole batch's `loss_normalizers`, so the summed loss is the whole batch's.
With kl_placement="reward", the KL enters total_reward_B through
`sequence_kl(sampling_logp_BT, ref_logp_BT, keep_BT, cfg.kl_kind)` (the sampling policy's logprobs:
the trainer's recomputed ones, or the engine's when no extra forward pass is wanted) and
`combine_rewards(..., weights={"kl": cfg.kl_beta})`; with "loss", rl_loss adds it per token.
"""

import dataclasses

import jax.numpy as jnp

from c2.rl.objectives.advantages import ADVANTAGE_ESTIMATORS
from c2.rl.objectives.aggregation import AGGREGATIONS, aggregate_loss
from c2.rl.objectives.kl import KL_ESTIMATORS, KL_PLACEMENTS, kl_token_loss
from c2.rl.objectives.mismatch import MISMATCH_LEVELS, mismatch_filter
from c2.rl.objectives.policy_gradient import (
    IMPORTANCE_CORRECTIONS,
    IMPORTANCE_LEVELS,
    policy_gradient_loss,
)
from c2.rl.objectives.registry import check_choice, check_number


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    """Every algorithmic choice of the RL loss; defaults are the recipe's (docs/recipe.md §2).

    Hashable, so it can be a static argument of a jitted train step. `loss_constant` has no
    default: it depends on the run (the recipe's choice is group_size * max_length).
    kl_beta, the TIS cap and the MIS interval are not given by the report: set them per run.
    The mismatch filter drops a token above either limit: the quantile (the report's p99) and
    `mismatch_threshold` in nats (c2's: a guard against broken tokens, above the numerics and
    above a few updates' drift, so it also judges stale samples; docs/recipe.md §2).
    """

    group_size: int
    loss_constant: float | None = None
    advantage: str = "group_mean"
    kl_kind: str = "k1"
    kl_placement: str = "reward"
    kl_beta: float = 1e-3
    aggregation: str = "sum_constant"
    importance_correction: str = "tis"
    importance_level: str = "token"
    tis_cap: float = 2.0
    mis_low: float = 0.5
    mis_high: float = 2.0
    clip_low: float | None = None
    clip_high: float | None = None
    mismatch_level: str = "token"
    mismatch_threshold: float | None = 3.0
    mismatch_quantile: float | None = 0.99

    def __post_init__(self):
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int):
            raise ValueError(f"group_size={self.group_size!r} must be an int")
        check_number("group_size", self.group_size, low=1)
        check_choice("advantage", self.advantage, ADVANTAGE_ESTIMATORS.names())
        check_choice("kl_kind", self.kl_kind, KL_ESTIMATORS.names())
        check_choice("kl_placement", self.kl_placement, KL_PLACEMENTS)
        check_number("kl_beta", self.kl_beta, low=0.0)
        check_choice("aggregation", self.aggregation, AGGREGATIONS.names())
        if self.aggregation == "sum_constant" and self.loss_constant is None:
            raise ValueError(
                "aggregation='sum_constant' needs loss_constant (e.g. group_size * max_length)"
            )
        if self.loss_constant is not None:
            check_number("loss_constant", self.loss_constant, low=0.0, low_open=True)
        check_choice(
            "importance_correction", self.importance_correction, IMPORTANCE_CORRECTIONS.names()
        )
        check_choice("importance_level", self.importance_level, IMPORTANCE_LEVELS)
        check_number("tis_cap", self.tis_cap, low=0.0, low_open=True)
        check_number("mis_low", self.mis_low, low=0.0)
        check_number("mis_high", self.mis_high, low=self.mis_low)
        if self.clip_low is not None:
            check_number("clip_low", self.clip_low, low=0.0, high=1.0)
        if self.clip_high is not None:
            check_number("clip_high", self.clip_high, low=0.0)
        check_choice("mismatch_level", self.mismatch_level, MISMATCH_LEVELS)
        check_number("mismatch_threshold", self.mismatch_threshold, low=0.0)
        check_number("mismatch_quantile", self.mismatch_quantile, low=0.0, high=1.0, low_open=True)


def objective_advantages(cfg: ObjectiveConfig, rewards_B, valid_B=None) -> jnp.ndarray:
    """Advantages of the whole batch with the configured estimator."""
    return ADVANTAGE_ESTIMATORS.get(cfg.advantage)(rewards_B, cfg.group_size, valid_B)


def objective_mismatch_filter(cfg: ObjectiveConfig, train_logp_BT, infer_logp_BT, mask_BT):
    """The configured mismatch filter on the whole batch: (keep_BT, stats)."""
    return mismatch_filter(
        train_logp_BT,
        infer_logp_BT,
        mask_BT,
        level=cfg.mismatch_level,
        threshold=cfg.mismatch_threshold,
        quantile=cfg.mismatch_quantile,
    )


def rl_loss(
    cfg: ObjectiveConfig,
    logp_BT,
    behaviour_logp_BT,
    advantages,
    mask_BT,
    *,
    ref_logp_BT=None,
    old_logp_BT=None,
    num_tokens=None,
    num_sequences=None,
):
    """Scalar loss and metrics: policy-gradient term (+ KL term when placed in the loss).

    `mask_BT` is the padding mask after the mismatch filter; `num_tokens`/`num_sequences` are
    the whole step's counts of it (see `loss_normalizers`), needed for micro-batch invariance.
    """
    token_loss_BT, metrics = policy_gradient_loss(
        logp_BT,
        behaviour_logp_BT,
        advantages,
        mask_BT,
        old_logp_BT=old_logp_BT,
        correction=cfg.importance_correction,
        level=cfg.importance_level,
        tis_cap=cfg.tis_cap,
        mis_low=cfg.mis_low,
        mis_high=cfg.mis_high,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
    )
    normalizers = dict(
        constant=cfg.loss_constant, num_tokens=num_tokens, num_sequences=num_sequences
    )
    pg_loss = aggregate_loss(token_loss_BT, mask_BT, cfg.aggregation, **normalizers)
    metrics = {**metrics, "pg_loss": pg_loss}
    loss = pg_loss
    if cfg.kl_placement == "loss":
        if ref_logp_BT is None:
            raise ValueError("kl_placement='loss' needs ref_logp_BT")
        kl_BT = kl_token_loss(logp_BT, ref_logp_BT, mask_BT, cfg.kl_kind, cfg.kl_beta)
        kl_loss = aggregate_loss(kl_BT, mask_BT, cfg.aggregation, **normalizers)
        metrics["kl_loss"] = kl_loss
        loss = loss + kl_loss
    metrics["loss"] = loss
    return loss, metrics
