"""Rollout samples -> train batches of fixed shapes (one compile per bucket, not per step).

`make_batch` lays complete groups out row after row: B = batch_size rows (rows past the last
sample are padding, `valid` False) and T = the smallest sequence bucket holding the longest
sample. Position t holds input token t and *targets* token t + 1, so every per-target array
(`targets`, `target_mask`, `behaviour_logp`, `target_versions`) is the sample's array shifted left
by one: `behaviour_logp[b, t]` is the engine's logprob of `targets[b, t]` given `inputs[b, :t+1]`.
Padding positions replay experts 0..k-1 (distinct and in range, so the replayed forward is valid).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from c2.model.config import ModelConfig
from c2.rl.records import Sample

# [B, T] arrays, [B] arrays, and routing [L_moe, B, T, k]: everything the RL step reads.
TOKEN_KEYS = (
    "inputs",
    "positions",
    "segment_ids",
    "targets",
    "target_mask",
    "behaviour_logp",
    "target_versions",
)
ROW_KEYS = ("temperature", "top_p", "top_k", "valid")
BATCH_KEYS = (*TOKEN_KEYS, "routing", *ROW_KEYS)


def _name(s: Sample) -> str:
    return f"sample {s.group_id}/{s.sample_index} (prompt {s.prompt_id})"


def choose_bucket(length: int, seq_buckets: Sequence[int], what: str = "the batch") -> int:
    """The smallest bucket >= length; a ValueError naming `what` and the buckets if none is."""
    for bucket in seq_buckets:
        if bucket >= length:
            return int(bucket)
    raise ValueError(
        f"{what} has {length} tokens; the largest of seq_buckets={tuple(seq_buckets)} is "
        f"{max(seq_buckets)} (add a bucket or cap episode length)"
    )


def _check_buckets(seq_buckets, cfg: ModelConfig) -> tuple[int, ...]:
    buckets = tuple(seq_buckets)
    ok = buckets and all(isinstance(b, int | np.integer) and b >= 2 for b in buckets)
    if not ok or list(buckets) != sorted(set(buckets)):
        raise ValueError(f"seq_buckets={buckets!r}: expected a sorted tuple of distinct ints >= 2")
    if buckets[-1] > cfg.max_seq_len:
        raise ValueError(
            f"seq_buckets={buckets}: {buckets[-1]} exceeds the model's "
            f"max_seq_len={cfg.max_seq_len}"
        )
    return buckets


def _check_sample(s: Sample, cfg: ModelConfig) -> None:
    L, k = cfg.n_moe_layers, cfg.n_experts_per_token
    if s.length < 2:
        raise ValueError(f"{_name(s)} has {s.length} tokens; a sample needs a prompt and a target")
    tokens = np.asarray(s.tokens)
    if tokens.min() < 0 or tokens.max() >= cfg.vocab_size:
        raise ValueError(
            f"{_name(s)}: tokens hold ids outside [0, vocab_size={cfg.vocab_size}) "
            f"(min {tokens.min()}, max {tokens.max()})"
        )
    if s.loss_mask[0]:
        raise ValueError(f"{_name(s)}: loss_mask[0] is set; the first token has nothing before it")
    if s.routing.shape[1:] != (L, k):
        raise ValueError(
            f"{_name(s)}: routing has shape {s.routing.shape}; expected [T={s.length}, "
            f"n_moe_layers={L}, k={k}]"
        )
    if s.routing.size and int(s.routing.max()) >= cfg.n_experts:
        raise ValueError(
            f"{_name(s)}: routing holds expert {int(s.routing.max())} >= n_experts={cfg.n_experts}"
        )
    repeated = np.any(np.diff(np.sort(s.routing, axis=-1), axis=-1) == 0, axis=-1)  # [T, L]
    if repeated.any():
        t, layer = np.argwhere(repeated)[0]
        raise ValueError(
            f"{_name(s)}: routing repeats an expert at token {t}, MoE layer {layer}: "
            f"{s.routing[t, layer].tolist()}"
        )


def make_batch(
    samples: Sequence[Sample],
    *,
    batch_size: int,
    seq_buckets: Sequence[int],
    cfg: ModelConfig,
    pad_id: int,
    group_size: int | None = None,
) -> dict[str, np.ndarray]:
    """The samples (complete groups, in order) as one batch of fixed shapes; see the module doc.

    With `group_size`, also checks the layout the advantage estimators assume: consecutive runs
    of `group_size` samples sharing a group_id, and batch_size a multiple of group_size.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}: expected a positive int")
    if len(samples) > batch_size:
        raise ValueError(f"{len(samples)} samples do not fit batch_size={batch_size}")
    if not 0 <= pad_id < cfg.vocab_size:
        raise ValueError(f"pad_id={pad_id}: expected an id in [0, vocab_size={cfg.vocab_size})")
    buckets = _check_buckets(seq_buckets, cfg)
    if group_size is not None:
        _check_groups(samples, batch_size, group_size)
    for s in samples:
        _check_sample(s, cfg)
        choose_bucket(s.length, buckets, _name(s))
    T = choose_bucket(max((s.length for s in samples), default=0), buckets)
    B, L, k = batch_size, cfg.n_moe_layers, cfg.n_experts_per_token

    out = {
        "inputs": np.full((B, T), pad_id, np.int32),
        "positions": np.zeros((B, T), np.int32),
        "segment_ids": np.zeros((B, T), np.int32),
        "targets": np.full((B, T), pad_id, np.int32),
        "target_mask": np.zeros((B, T), np.float32),
        "behaviour_logp": np.zeros((B, T), np.float32),
        "target_versions": np.full((B, T), -1, np.int32),
        # Padding replays experts 0..k-1: distinct and valid, whatever it is multiplied by.
        "routing": np.broadcast_to(np.arange(k, dtype=np.int32), (L, B, T, k)).copy(),
        "temperature": np.ones((B,), np.float32),
        "top_p": np.ones((B,), np.float32),
        "top_k": np.zeros((B,), np.int32),
        "valid": np.zeros((B,), bool),
    }
    for b, s in enumerate(samples):
        n = s.length
        out["inputs"][b, :n] = s.tokens
        out["positions"][b, :n] = np.arange(n, dtype=np.int32)
        out["segment_ids"][b, :n] = 1
        out["targets"][b, : n - 1] = s.tokens[1:]
        out["target_mask"][b, : n - 1] = s.loss_mask[1:] > 0
        out["behaviour_logp"][b, : n - 1] = np.where(s.loss_mask[1:] > 0, s.logprobs[1:], 0.0)
        out["target_versions"][b, : n - 1] = np.where(s.loss_mask[1:] > 0, s.versions[1:], -1)
        out["routing"][:, b, :n] = np.asarray(s.routing, np.int32).transpose(1, 0, 2)
        out["temperature"][b] = s.temperature
        out["top_p"][b] = s.top_p
        out["top_k"][b] = s.top_k
        out["valid"][b] = True
    return out


def _check_groups(samples: Sequence[Sample], batch_size: int, group_size: int) -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size={group_size!r}: expected a positive int")
    if batch_size % group_size:
        raise ValueError(f"batch_size={batch_size} is not a multiple of group_size={group_size}")
    for start in range(0, len(samples), group_size):
        group = samples[start : start + group_size]
        ids = {s.group_id for s in group}
        if len(group) != group_size or len(ids) != 1:
            raise ValueError(
                f"samples {start}..{start + len(group) - 1} should be one complete group of "
                f"{group_size}; got {len(group)} samples of groups {sorted(ids)}"
            )


def _row_values(samples: Sequence[Sample], field: str, batch_size: int) -> dict[str, np.ndarray]:
    names = sorted({n for s in samples for n in getattr(s, field)})
    out = {n: np.zeros((batch_size,), np.float32) for n in names}
    for b, s in enumerate(samples):
        values = getattr(s, field)
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f"{_name(s)}: {field} lacks {missing}, which other samples have")
        for n in names:
            out[n][b] = values[n]
    return out


def reward_arrays(
    samples: Sequence[Sample], batch_size: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(reward terms, effort counts), each name -> [batch_size] float32, padding rows 0.

    Every sample must carry the same names (a term one sample lacks would silently count as 0).
    """
    if len(samples) > batch_size:
        raise ValueError(f"{len(samples)} samples do not fit batch_size={batch_size}")
    return (
        _row_values(samples, "reward_terms", batch_size),
        _row_values(samples, "effort", batch_size),
    )
