"""AdamW with warmup + decay, global-norm clipping, and parameters the optimiser must not touch."""

from __future__ import annotations

import re

import jax
import ml_collections
import optax


def make_schedule(opt: ml_collections.ConfigDict, steps: int) -> optax.Schedule:
    """Linear warmup from 0 to `opt.lr`, then the named decay down to `lr * end_lr_ratio`."""
    peak, end = opt.lr, opt.lr * opt.end_lr_ratio
    warmup = optax.linear_schedule(0.0, peak, opt.warmup_steps)
    rest = max(steps - opt.warmup_steps, 1)
    if opt.schedule == "cosine":
        decay = optax.cosine_decay_schedule(peak, rest, alpha=opt.end_lr_ratio)
    elif opt.schedule == "linear":
        decay = optax.linear_schedule(peak, end, rest)
    elif opt.schedule == "constant":
        decay = optax.constant_schedule(peak)
    elif opt.schedule == "wsd":  # warmup-stable-decay: flat, then a linear cool-down at the end
        decay_steps = max(int(round(rest * opt.decay_fraction)), 1)
        decay = optax.join_schedules(
            [optax.constant_schedule(peak), optax.linear_schedule(peak, end, decay_steps)],
            [rest - decay_steps],
        )
    else:
        raise ValueError(f"config.optimizer.schedule: unknown schedule {opt.schedule!r}")
    return optax.join_schedules([warmup, decay], [opt.warmup_steps])


def path_str(path) -> str:
    """A pytree key path as "a/b/c"."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def param_labels(params, frozen: str):
    """ "frozen" for parameters whose path matches the regex `frozen`, else "train"."""
    pattern = re.compile(frozen) if frozen else None
    return jax.tree_util.tree_map_with_path(
        lambda p, _: "frozen" if pattern and pattern.search(path_str(p)) else "train", params
    )


def decay_mask(params):
    """Weight decay on matrices only: norms' scales and biases are not decayed."""
    return jax.tree.map(lambda x: x.ndim >= 2, params)


def make_optimizer(
    opt: ml_collections.ConfigDict, steps: int, params
) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optimiser for `params` (arrays or ShapeDtypeStructs) and its learning-rate schedule."""
    schedule = make_schedule(opt, steps)
    adamw = optax.chain(
        optax.clip_by_global_norm(opt.clip_norm) if opt.clip_norm else optax.identity(),
        optax.adamw(
            schedule,
            b1=opt.b1,
            b2=opt.b2,
            eps=opt.eps,
            weight_decay=opt.weight_decay,
            mask=decay_mask,
            mu_dtype=opt.get("mu_dtype") or None,
        ),
    )
    labels = param_labels(params, opt.frozen)
    tx = optax.multi_transform({"train": adamw, "frozen": optax.set_to_zero()}, labels)
    return tx, schedule
