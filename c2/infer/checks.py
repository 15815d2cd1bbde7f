"""Checks of what callers hand the engine (`Engine`, `submit`, `extend`, `update_weights`,
`generate`): token ids, counts, context length, speculative drafting, stop tokens and strings,
room in the context, new weights' shapes. Each fails before anything compiles, with a message
naming the argument."""

from __future__ import annotations

import jax
import numpy as np

from c2.model.config import ModelConfig


def token_array(tokens, vocab_size: int, what: str) -> np.ndarray:
    """`tokens` as int32, checked: a non-empty 1-D sequence of ids in the vocabulary."""
    arr = np.asarray(tokens)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(
            f"{what}: expected a 1-D sequence of int token ids, got {arr.dtype}{list(arr.shape)}"
        )
    if arr.size == 0:
        raise ValueError(f"{what} is empty: expected at least one token")
    if arr.min() < 0 or arr.max() >= vocab_size:
        raise ValueError(
            f"{what}: token ids must lie in [0, vocab_size={vocab_size}); got min {arr.min()} "
            f"max {arr.max()}"
        )
    return arr.astype(np.int32)


def positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name}={value!r}: expected an int >= 1")
    return int(value)


def stop_tokens(ids, vocab_size: int) -> tuple[int, ...]:
    out = tuple(int(t) for t in ids)
    for t in out:
        if not 0 <= t < vocab_size:
            raise ValueError(f"stop_tokens: id {t} outside the vocabulary [0, {vocab_size})")
    return out


def stop_strings(strings, detokenize) -> tuple[str, ...]:
    """Non-empty strings; any at all need `detokenize` (the engine matches them in text)."""
    if isinstance(strings, str):
        raise ValueError(f"stop_strings={strings!r}: expected a sequence of strings")
    out = tuple(strings)
    if any(not isinstance(s, str) or not s for s in out):
        raise ValueError(f"stop_strings={out!r}: expected non-empty strings")
    if out and detokenize is None:
        raise ValueError("stop_strings need detokenize (token ids -> str), e.g. tokenizer.decode")
    return out


def room(seq_len: int, max_new_tokens, max_len: int, what: str) -> int:
    """max_new_tokens, checked, for a sequence of `seq_len` tokens that must leave room in a
    context of `max_len` for at least one generated token."""
    max_new = positive_int(max_new_tokens, "max_new_tokens")
    if seq_len >= max_len:
        raise ValueError(
            f"{what} has {seq_len} tokens but the context holds max_len={max_len}: "
            "no room for a generated token"
        )
    return max_new


def max_len(value, max_seq_len: int) -> int:
    """The engine's context per sequence: default, and at most, the model's `max_seq_len`."""
    out = max_seq_len if value is None else positive_int(value, "max_len")
    if not 2 <= out <= max_seq_len:
        raise ValueError(f"max_len={out}: expected in [2, cfg.max_seq_len={max_seq_len}]")
    return out


def num_draft(speculative: bool, num_draft_tokens, cfg: ModelConfig, params) -> int:
    """Tokens drafted a verify pass: 0 without speculative decoding; with it, default
    cfg.mtp_depth, and the config and params must have MTP modules."""
    if not speculative:
        return 0
    if cfg.mtp_depth < 1 or "mtp" not in params:
        raise ValueError(
            f"speculative=True needs MTP modules: cfg.mtp_depth={cfg.mtp_depth} and params "
            f"{'have' if 'mtp' in params else 'lack'} an 'mtp' entry"
        )
    n = cfg.mtp_depth if num_draft_tokens is None else num_draft_tokens
    return positive_int(n, "num_draft_tokens")


def same_weights(params, tree, leaves) -> None:
    """`update_weights`: new params have the tree structure and each leaf's (shape, dtype) of
    the ones the engine was built with."""
    if jax.tree.structure(params) != tree:
        raise ValueError("update_weights: params have a different tree structure")
    for (shape, dtype), b in zip(leaves, jax.tree.leaves(params)):
        if shape != b.shape or dtype != b.dtype:
            raise ValueError(
                f"update_weights: a leaf changed from {dtype}{list(shape)} to "
                f"{b.dtype}{list(b.shape)}"
            )
