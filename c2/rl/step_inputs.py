"""The RL step's inputs, checked before anything compiles and placed on the learner's layout:
a batch from c2.rl.batching.make_batch (plain or packed groups) and the environment's reward
terms and effort counts. Each check raises a ValueError naming the field and what it expected.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding

from c2 import sharding
from c2.model.config import ModelConfig
from c2.rl.batching import (
    BATCH_KEYS,
    CHAIN_KEYS,
    PACKED_KEYS,
    PACKED_TOKEN_KEYS,
    ROW_KEYS,
    TOKEN_KEYS,
)
from c2.rl.logprobs import Forwards
from c2.rl.objectives import REWARD_SIGNS, EffortWeights
from c2.rl.objectives.rewards import Weight

COMPUTED_TERMS = ("kl", "length_penalty")  # reward terms the learner computes itself


def is_zero(weight: Weight) -> bool:
    return not callable(weight) and float(weight) == 0.0


def place(x, sharding: NamedSharding) -> jax.Array:
    """A host array laid out by `sharding`. Across several processes, each places only the shards
    of its own devices, from its own copy: every process must hold the same `x` (the RL trainer
    shares process 0's batch, c2/rl/trainer.py)."""
    x = np.asarray(x)
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def put_batch(batch, forwards: Forwards) -> dict:
    """The batch's fields placed by the forwards' specs (the layout's rules)."""
    keys = BATCH_KEYS + (PACKED_KEYS if "packed_index" in batch else ())
    mesh = forwards.layout.mesh
    return {k: place(batch[k], NamedSharding(mesh, forwards.specs[k])) for k in keys}


def check_fields(batch, shapes: dict, int_keys, context: str) -> None:
    """A ValueError naming the first field of `batch` whose shape is not `shapes[field]`, or
    (among `int_keys`) whose dtype is not an integer one; `context` says where shapes came from."""
    for key, expected in shapes.items():
        if np.shape(batch[key]) != expected:
            raise ValueError(
                f"batch[{key!r}] has shape {np.shape(batch[key])}; expected {expected} ({context})"
            )
    for key in int_keys:
        if not np.issubdtype(np.asarray(batch[key]).dtype, np.integer):
            raise ValueError(f"batch[{key!r}] has dtype {batch[key].dtype}; expected ints")


def check_batch(
    batch: Mapping[str, np.ndarray], cfg: ModelConfig, group_size: int, forwards: Forwards
) -> tuple[int, int]:
    """(B, T) of a batch from c2.rl.batching.make_batch; a ValueError naming a bad field."""
    missing = [k for k in BATCH_KEYS if k not in batch]
    if missing:
        raise ValueError(f"batch lacks {missing} (make it with c2.rl.batching.make_batch)")
    shape = np.shape(batch["inputs"])
    if len(shape) != 2:
        raise ValueError(f"batch['inputs'] has shape {shape}; expected [B, T]")
    B, T = shape
    want = {k: (B, T) for k in TOKEN_KEYS} | {k: (B,) for k in ROW_KEYS}
    C = np.shape(batch["chain_valid"])[0] if np.ndim(batch["chain_valid"]) == 1 else -1
    want |= {k: (C,) for k in CHAIN_KEYS}
    want["routing"] = (cfg.n_moe_layers, B, T, cfg.n_experts_per_token)
    check_fields(
        batch,
        want,
        ("inputs", "targets", "positions", "segment_ids", "routing", "top_k", "chain"),
        f"B={B}, T={T} from batch['inputs']",
    )
    mb = forwards.micro_batch_size
    if B % mb:
        raise ValueError(f"batch size B={B} is not divisible by micro_batch_size={mb}")
    if C % group_size:
        raise ValueError(
            f"chains B_c={C} (batch['chain_valid']) are not a multiple of group_size={group_size}"
        )
    chain = np.asarray(batch["chain"])
    if ((chain < 0) | (chain >= C)).any():
        raise ValueError(f"batch['chain'] holds ids outside [0, B_c={C})")
    sharding.check_divisible(forwards.layout, batch=B, seq=T)
    if any(k in batch for k in PACKED_KEYS):
        _check_packed(batch, B, T, cfg, forwards)
    return B, T


def _check_packed(batch, B: int, T: int, cfg: ModelConfig, forwards: Forwards) -> None:
    missing = [k for k in PACKED_KEYS if k not in batch]
    if missing:
        raise ValueError(f"batch lacks {missing} (make_batch's pack_buckets makes them all)")
    shape = np.shape(batch["packed_inputs"])
    if len(shape) != 2:
        raise ValueError(f"batch['packed_inputs'] has shape {shape}; expected [R, W]")
    R, W = shape
    want = {k: (R, W) for k in PACKED_TOKEN_KEYS} | {"packed_index": (B, T)}
    want["packed_routing"] = (cfg.n_moe_layers, R, W, cfg.n_experts_per_token)
    check_fields(
        batch,
        want,
        ("packed_inputs", "packed_targets", "packed_positions", "packed_segment_ids"),
        f"R={R}, W={W} from batch['packed_inputs'], B={B}, T={T}",
    )
    index = np.asarray(batch["packed_index"])
    if not np.issubdtype(index.dtype, np.integer) or index.min() < 0 or index.max() >= R * W:
        raise ValueError(f"batch['packed_index'] must hold ints in [0, R * W = {R * W})")
    if R % forwards.batch_devices:
        raise ValueError(
            f"packed rows R={R} (one per group) are not divisible by the mesh's batch axes "
            f"{forwards.batch_axes} of size {forwards.batch_devices}: pack more groups a step"
        )
    sharding.check_divisible(forwards.layout, seq=W)
    forwards.packed_rows_per_micro(R, B)


def check_rewards(
    terms,
    effort_counts,
    B: int,
    reward_weights: Mapping[str, Weight],
    effort_weights: EffortWeights | None,
    use_length_penalty: bool,
):
    """(terms, effort_counts) as float32 [B] host arrays, each named and checked against the
    weights that read it."""
    terms = dict(terms)
    for name in terms:
        if name in COMPUTED_TERMS:
            raise ValueError(f"terms[{name!r}]: the learner computes this term itself")
        if name not in REWARD_SIGNS:
            raise ValueError(f"terms[{name!r}]: not among {sorted(REWARD_SIGNS)}")
        if name not in reward_weights:
            raise ValueError(f"terms[{name!r}] has no weight in reward_weights")
    weighted = {n for n, w in reward_weights.items() if not is_zero(w)}
    missing = sorted(weighted - set(terms))
    if missing:
        raise ValueError(f"terms lack {missing}, which reward_weights weights (nonzero)")
    out_terms = {}
    for name, value in terms.items():
        value = np.asarray(value, np.float32)
        if value.shape != (B,):
            raise ValueError(f"terms[{name!r}] has shape {value.shape}; expected [B={B}]")
        if not np.isfinite(value).all():
            raise ValueError(f"terms[{name!r}] holds non-finite rewards")
        out_terms[name] = value
    out_effort = {}
    if use_length_penalty:
        for name, value in dict(effort_counts or {}).items():
            value = np.asarray(value, np.float32)
            if value.shape != (B,):
                raise ValueError(
                    f"effort_counts[{name!r}] has shape {value.shape}; expected [B={B}]"
                )
            if not (np.isfinite(value) & (value >= 0)).all():
                raise ValueError(f"effort_counts[{name!r}]: expected finite counts >= 0")
            out_effort[name] = value
        needed = [n for n, w in vars(effort_weights).items() if w]
        lacking = [n for n in needed if n not in out_effort]
        if lacking:
            raise ValueError(f"effort_counts lack {lacking}, weighted in effort_weights")
    return out_terms, out_effort
