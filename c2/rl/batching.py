"""Rollout samples -> train batches of fixed shapes (one compile per bucket, not per step).

`make_batch` lays complete groups out row after row: B = batch_size rows (rows past the last
sample are padding, `valid` False) and T = the smallest sequence bucket holding the longest
sample. Position t holds input token t and *targets* token t + 1, so every per-target array
(`targets`, `target_mask`, `behaviour_logp`, `target_versions`, `target_penalty`: the target's
turn penalty, `Sample.token_penalties`) is the sample's array shifted left by one:
`behaviour_logp[b, t]` is the engine's logprob of `targets[b, t]` given `inputs[b, :t+1]`.
Padding positions replay experts 0..k-1 (distinct and in range, so the replayed forward is valid).

Packed groups (`pack_buckets`): a group's samples share their prompt, so the model's input can
hold it once. Each group takes one packed row (`packed_*` arrays, [R, W] with R = batch_size /
group_size, or `pack_rows` with padding rows, and W = the smallest of `pack_buckets` holding the
longest row): its trunk, the tokens every sample of the group shares before its first
generated one (tokens and recorded experts equal) less the last, then each sample's remaining
tokens as a branch that sees the trunk and itself (segment ids `1 + j * BRANCH_STRIDE`,
c2.model.flash), positions continuing the trunk's. Every target lies in a branch, so each
sample's log-probs are read back from the packed forward by `packed_index` [B, T] (a flat index
into [R * W]; positions without a target point at 0, a finite value every use masks). The
per-sample arrays (targets, masks, behaviour log-probs) keep the layout above; only the
forward's input changes.

Chains: a sample whose episode was cut into segments (c2.rl.records) brings its earlier segments,
and each segment takes a row of its own, in chain order. The advantage's unit is the chain:
`batch_size` counts chains (B_c, group after group), `chain` [B] names each row's chain and
`chain_valid` [B_c] marks the chains present; the rows are a multiple of B_c (one compile per
row count). Without segments, rows and chains coincide (chain[b] = b).

Failed samples (`FAILED_STOP_REASONS`: the prompt did not fit, or the episode raised on every
attempt) are present chains whose rows are not `valid`: nothing of theirs is trained and they
are left out of their group's baseline (a reward of 0 would raise the others' advantages).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from c2.model.config import ModelConfig
from c2.model.flash import BRANCH_STRIDE
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
    "target_penalty",
)
ROW_KEYS = ("temperature", "top_p", "top_k", "valid", "chain")
CHAIN_KEYS = ("chain_valid",)  # [B_c]: per chain
BATCH_KEYS = (*TOKEN_KEYS, "routing", *ROW_KEYS, *CHAIN_KEYS)
# Packed groups: [R, W] per position (sampling settings too: a row holds several samples), the
# routing [L_moe, R, W, k], and packed_index [B, T].
PACKED_TOKEN_KEYS = (
    "packed_inputs",
    "packed_positions",
    "packed_segment_ids",
    "packed_targets",
    "packed_temperature",
    "packed_top_k",
    "packed_top_p",
)
PACKED_KEYS = (*PACKED_TOKEN_KEYS, "packed_routing", "packed_index")
# Samples with nothing generated: they complete their group, and train nothing.
FAILED_STOP_REASONS = ("prompt_too_long", "rollout_error")


def _name(s: Sample) -> str:
    return f"sample {s.group_id}/{s.sample_index} (prompt {s.prompt_id})"


def choose_bucket(
    length: int, seq_buckets: Sequence[int], what: str = "the batch", name: str = "seq_buckets"
) -> int:
    """The smallest bucket >= length; a ValueError naming `what` and the buckets if none is."""
    for bucket in seq_buckets:
        if bucket >= length:
            return int(bucket)
    raise ValueError(
        f"{what} has {length} tokens; the largest of {name}={tuple(seq_buckets)} is "
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
    rows: int | None = None,
    pack_buckets: Sequence[int] | None = None,
    pack_rows: int | None = None,
    min_seq: int = 0,
    min_pack: int = 0,
) -> dict[str, np.ndarray]:
    """The samples (complete groups, in order) as one batch of fixed shapes; see the module doc.

    With `group_size`, also checks the layout the advantage estimators assume: consecutive runs
    of `group_size` samples sharing a group_id, and batch_size a multiple of group_size.
    batch_size counts chains; `rows` (default: the smallest multiple of batch_size that holds
    every segment) the rows. `pack_buckets` (needs group_size; no chains) adds the packed
    groups' arrays, `pack_rows` rows of them (default: a row per group of batch_size; more
    rows are padding, e.g. to spread them over the devices). `min_seq` / `min_pack`: the
    buckets chosen hold at least this many tokens (a larger bucket than the samples need, all
    padding past them; with no samples, an all-padding batch of that bucket's shape, to compile
    its program before a batch needs it).
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
    segments = chain_rows(samples)
    B = _rows(len(segments), batch_size, rows)
    for _, s in segments:
        _check_sample(s, cfg)
        choose_bucket(s.length, buckets, _name(s))
    T = choose_bucket(max([s.length for _, s in segments] + [min_seq]), buckets)
    L, k = cfg.n_moe_layers, cfg.n_experts_per_token

    out = {
        "inputs": np.full((B, T), pad_id, np.int32),
        "positions": np.zeros((B, T), np.int32),
        "segment_ids": np.zeros((B, T), np.int32),
        "targets": np.full((B, T), pad_id, np.int32),
        "target_mask": np.zeros((B, T), np.float32),
        "behaviour_logp": np.zeros((B, T), np.float32),
        "target_versions": np.full((B, T), -1, np.int32),
        "target_penalty": np.zeros((B, T), np.float32),
        # Padding replays experts 0..k-1: distinct and valid, whatever it is multiplied by.
        "routing": np.broadcast_to(np.arange(k, dtype=np.int32), (L, B, T, k)).copy(),
        "temperature": np.ones((B,), np.float32),
        "top_p": np.ones((B,), np.float32),
        "top_k": np.zeros((B,), np.int32),
        "valid": np.zeros((B,), bool),
        "chain": np.zeros((B,), np.int32),
        "chain_valid": np.zeros((batch_size,), bool),
    }
    out["chain_valid"][: len(samples)] = True
    for b, (c, s) in enumerate(segments):
        n = s.length
        out["inputs"][b, :n] = s.tokens
        out["positions"][b, :n] = np.arange(n, dtype=np.int32)
        out["segment_ids"][b, :n] = 1
        out["targets"][b, : n - 1] = s.tokens[1:]
        out["target_mask"][b, : n - 1] = s.loss_mask[1:] > 0
        out["behaviour_logp"][b, : n - 1] = np.where(s.loss_mask[1:] > 0, s.logprobs[1:], 0.0)
        out["target_versions"][b, : n - 1] = np.where(s.loss_mask[1:] > 0, s.versions[1:], -1)
        out["target_penalty"][b, : n - 1] = s.token_penalties()[1:]
        out["routing"][:, b, :n] = np.asarray(s.routing, np.int32).transpose(1, 0, 2)
        out["temperature"][b] = s.temperature
        out["top_p"][b] = s.top_p
        out["top_k"][b] = s.top_k
        out["valid"][b] = s.stop_reason not in FAILED_STOP_REASONS
        out["chain"][b] = c
    if pack_buckets is not None:
        out |= pack_groups(
            samples,
            batch_size=batch_size,
            group_size=group_size,
            shape=(B, T),
            pack_buckets=pack_buckets,
            cfg=cfg,
            pad_id=pad_id,
            rows=pack_rows,
            min_width=min_pack,
        )
    return out


def trunk_length(group: Sequence[Sample]) -> int:
    """The length of the trunk a group's samples share in a packed row: their longest common
    prefix (ids and recorded experts) before any generated token, less its last token (whose
    prediction, a sample's first target, belongs to each branch)."""
    n = min(int(np.argmax(s.loss_mask > 0)) if s.loss_mask.any() else s.length for s in group)
    ref = group[0]
    for s in group[1:]:
        same = (s.tokens[:n] == ref.tokens[:n]) & np.all(
            s.routing[:n] == ref.routing[:n], axis=(1, 2)
        )
        n = n if same.all() else int(np.argmin(same))
    return max(n - 1, 0)


def pack_groups(
    samples: Sequence[Sample],
    *,
    batch_size: int,
    group_size: int | None,
    shape: tuple[int, int],
    pack_buckets: Sequence[int],
    cfg: ModelConfig,
    pad_id: int,
    rows: int | None = None,
    min_width: int = 0,
) -> dict[str, np.ndarray]:
    """The `packed_*` arrays of make_batch (module doc): one row per group, trunk then branches;
    `rows` rows (default batch_size / group_size), those past the groups padding; the width W
    the smallest of `pack_buckets` holding the longest row and `min_width`."""
    if group_size is None:
        raise ValueError("pack_buckets needs group_size: a packed row holds one group")
    if any(len(s.chain) > 1 for s in samples):
        raise ValueError(
            "pack_buckets: samples with segments (context management) cannot be packed; "
            "a packed row holds one prompt's single-segment samples"
        )
    buckets = tuple(pack_buckets)
    if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 2:
        raise ValueError(f"pack_buckets={buckets!r}: expected a sorted tuple of distinct ints >= 2")
    groups = [samples[i : i + group_size] for i in range(0, len(samples), group_size)]
    trunks = [trunk_length(g) for g in groups]
    lengths = [t + sum(s.length - t for s in g) for t, g in zip(trunks, groups)]
    for g, n in zip(groups, lengths):
        choose_bucket(n, buckets, f"the packed row of group {g[0].group_id}", "pack_buckets")
    n_groups = batch_size // group_size
    if rows is not None and rows < n_groups:
        raise ValueError(f"pack_rows={rows}: fewer rows than the batch's {n_groups} groups")
    R = rows or n_groups
    W = choose_bucket(
        max([*lengths, min_width]), buckets, "the widest packed row or min_pack", "pack_buckets"
    )
    L, k = cfg.n_moe_layers, cfg.n_experts_per_token
    out = {
        "packed_inputs": np.full((R, W), pad_id, np.int32),
        "packed_positions": np.zeros((R, W), np.int32),
        "packed_segment_ids": np.zeros((R, W), np.int32),
        "packed_targets": np.full((R, W), pad_id, np.int32),
        "packed_temperature": np.ones((R, W), np.float32),
        "packed_top_k": np.zeros((R, W), np.int32),
        "packed_top_p": np.ones((R, W), np.float32),
        "packed_routing": np.broadcast_to(np.arange(k, dtype=np.int32), (L, R, W, k)).copy(),
        "packed_index": np.zeros(shape, np.int32),
    }
    for r, (group, t) in enumerate(zip(groups, trunks)):
        first = group[0]
        out["packed_inputs"][r, :t] = first.tokens[:t]
        out["packed_positions"][r, :t] = np.arange(t)
        out["packed_segment_ids"][r, :t] = 1
        out["packed_routing"][:, r, :t] = np.asarray(first.routing[:t], np.int32).transpose(1, 0, 2)
        at = t
        for j, s in enumerate(group, 1):
            n = s.length - t  # the branch: tokens t .. length - 1
            span = slice(at, at + n)
            out["packed_inputs"][r, span] = s.tokens[t:]
            out["packed_positions"][r, span] = np.arange(t, s.length)
            out["packed_segment_ids"][r, span] = 1 + j * BRANCH_STRIDE
            out["packed_targets"][r, at : at + n - 1] = s.tokens[t + 1 :]
            out["packed_temperature"][r, span] = s.temperature
            out["packed_top_k"][r, span] = s.top_k
            out["packed_top_p"][r, span] = s.top_p
            routing = np.asarray(s.routing[t:], np.int32).transpose(1, 0, 2)
            out["packed_routing"][:, r, span] = routing
            # Sample position t + i (target t + i + 1) is branch position i.
            b = r * group_size + j - 1
            out["packed_index"][b, t : s.length - 1] = r * W + np.arange(at, at + n - 1)
            at += n
    return out


def chain_rows(samples: Sequence[Sample]) -> list[tuple[int, Sample]]:
    """(chain index, segment) for every row the samples fill, in order."""
    return [(c, seg) for c, s in enumerate(samples) for seg in s.chain]


def _rows(n: int, batch_size: int, rows: int | None) -> int:
    if rows is None:
        return batch_size * max(1, -(-n // batch_size))
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < batch_size:
        raise ValueError(f"rows={rows!r}: expected an int >= batch_size={batch_size}")
    if n > rows:
        raise ValueError(f"{n} segments do not fit rows={rows}")
    return rows


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


def _row_values(samples: Sequence[Sample], field: str, rows: int) -> dict[str, np.ndarray]:
    names = sorted({n for s in samples for n in getattr(s, field)})
    out = {n: np.zeros((rows,), np.float32) for n in names}
    for b, (_, s) in enumerate(chain_rows(samples)):
        values = getattr(s, field)
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f"{_name(s)}: {field} lacks {missing}, which other samples have")
        for n in names:
            out[n][b] = values[n]
    return out


def reward_arrays(
    samples: Sequence[Sample], batch_size: int, rows: int | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(reward terms, effort counts), each name -> [rows] float32 (rows as make_batch lays them
    out: a chain's terms on each of its segments), padding rows 0.

    Every sample must carry the same names (a term one sample lacks would silently count as 0).
    """
    if len(samples) > batch_size:
        raise ValueError(f"{len(samples)} samples do not fit batch_size={batch_size}")
    B = _rows(len(chain_rows(samples)), batch_size, rows)
    return (
        _row_values(samples, "reward_terms", B),
        _row_values(samples, "effort", B),
    )
