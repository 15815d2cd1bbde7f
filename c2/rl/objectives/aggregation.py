"""Loss aggregation: how per-token terms become one number (docs/recipe.md §2: sum / constant).

Every mode is a per-token weight w_BT, and the loss is sum(w_BT * token_loss_BT). The weights
use *global* counts (tokens, sequences of the whole optimiser step), so summing the losses of
micro-batches or devices gives exactly the loss of the whole batch:
  sum_constant              w = 1 / constant               (no per-sample length normalisation)
  token_mean                w = 1 / num_tokens             (DAPO-style)
  sequence_mean_token_mean  w = 1 / (num_sequences len_b)  (original GRPO: short samples count more)
  sequence_mean_token_sum   w = 1 / num_sequences
Pass the global counts to each micro-batch (from `loss_normalizers` on the whole batch, or with
`axis_name` inside shard_map); left out, they are counted on the batch given.
"""

import jax
import jax.numpy as jnp

from c2.rl.objectives.registry import Registry, check_number, check_tokens, f32, masked

AGGREGATIONS = Registry("aggregation")


def loss_normalizers(mask_BT, axis_name=None) -> dict[str, jnp.ndarray]:
    """Global token and sequence counts; `axis_name` sums them over devices inside shard_map."""
    check_tokens(mask_BT)
    m_BT = f32(mask_BT)
    num_sequences = (m_BT.sum(-1) > 0).sum().astype(jnp.float32)
    counts = {"num_tokens": m_BT.sum(), "num_sequences": num_sequences}
    if axis_name is not None:
        counts = jax.lax.psum(counts, axis_name)
    return counts


@AGGREGATIONS.register("sum_constant")
def _sum_constant(m_BT, constant, num_tokens, num_sequences):
    del num_tokens, num_sequences
    return m_BT / constant


@AGGREGATIONS.register("token_mean")
def _token_mean(m_BT, constant, num_tokens, num_sequences):
    del constant, num_sequences
    return m_BT / jnp.maximum(num_tokens, 1.0)


@AGGREGATIONS.register("sequence_mean_token_mean")
def _sequence_mean_token_mean(m_BT, constant, num_tokens, num_sequences):
    del constant, num_tokens
    len_B1 = m_BT.sum(-1, keepdims=True)
    return m_BT / (jnp.maximum(len_B1, 1.0) * jnp.maximum(num_sequences, 1.0))


@AGGREGATIONS.register("sequence_mean_token_sum")
def _sequence_mean_token_sum(m_BT, constant, num_tokens, num_sequences):
    del constant, num_tokens
    return m_BT / jnp.maximum(num_sequences, 1.0)


def token_weights(
    mask_BT, mode: str, *, constant=None, num_tokens=None, num_sequences=None
) -> jnp.ndarray:
    """The weight each token's loss gets under `mode` (zero on padding), float32 [B, T]."""
    weights_fn = AGGREGATIONS.get(mode)
    check_tokens(mask_BT)
    if mode == "sum_constant":
        if constant is None:
            raise ValueError(
                "aggregation='sum_constant' needs loss_constant (e.g. group_size * max_length)"
            )
        check_number("loss_constant", constant, low=0.0, low_open=True)
    counts = loss_normalizers(mask_BT)
    num_tokens = counts["num_tokens"] if num_tokens is None else f32(num_tokens)
    num_sequences = counts["num_sequences"] if num_sequences is None else f32(num_sequences)
    constant = None if constant is None else f32(constant)
    return weights_fn(f32(mask_BT), constant, num_tokens, num_sequences)


def aggregate_loss(
    token_loss_BT, mask_BT, mode: str, *, constant=None, num_tokens=None, num_sequences=None
) -> jnp.ndarray:
    """One scalar from per-token losses; padding contributes nothing, whatever its value."""
    check_tokens(mask_BT, token_loss_BT=token_loss_BT)
    w_BT = token_weights(
        mask_BT, mode, constant=constant, num_tokens=num_tokens, num_sequences=num_sequences
    )
    return (w_BT * masked(token_loss_BT, mask_BT)).sum()
