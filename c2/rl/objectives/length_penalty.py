"""The nonlinear length penalty and the effort it measures (docs/recipe.md §2, rewards).

C(k, q)(x) = ((1 + k x)^(1-q) - 1) / (k (1 - q)), with the q -> 1 limit log(1 + k x) / k.
C(0) = 0 and C'(x) = (1 + k x)^(-q) > 0; for q > 0 the slope falls as x grows, so the first
tokens of an easy task cost the most and a long, hard task pays little for thinking more.
q = 0 is linear (C = x); q > 1 is bounded by 1 / (k (q - 1)).
"""

import dataclasses
from collections.abc import Mapping

import chex
import jax.numpy as jnp

from c2.rl.objectives.registry import check_number, f32

# Below this |(1 - q) log(1 + k x)| a 3-term series replaces expm1(.)/(1 - q): exact at q = 1,
# relative error < 1e-10 at the switch, so the penalty is continuous (and smooth) through q = 1.
_SERIES_BELOW = 1e-3


def length_penalty(x, k, q) -> jnp.ndarray:
    """C(k, q)(x) elementwise, float32; x >= 0 an effort measure, k > 0, any real q."""
    check_number("length_penalty k", k, low=0.0, low_open=True)
    check_number("length_penalty x", x, low=0.0)
    x, k, q = f32(x), f32(k), f32(q)
    a = 1.0 - q
    log1p_kx = jnp.log1p(k * x)
    z = a * log1p_kx
    small = jnp.abs(z) < _SERIES_BELOW
    z_safe = jnp.where(small, 1.0, z)  # keeps the unselected branch (and its gradient) finite
    exact = log1p_kx * jnp.expm1(z_safe) / z_safe
    series = log1p_kx * (1.0 + z / 2.0 + z * z / 6.0)
    return jnp.where(small, series, exact) / k


@dataclasses.dataclass(frozen=True)
class EffortWeights:
    """Weights of the effort measure x: what a sample's length costs, in token-equivalents.

    Tool outputs are written by the environment, not the model, so they cost nothing by default.
    """

    thinking_tokens: float = 1.0
    tool_call_tokens: float = 1.0
    tool_output_tokens: float = 0.0
    final_message_tokens: float = 1.0
    num_tool_calls: float = 0.0
    num_turns: float = 0.0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            check_number(f"EffortWeights.{field.name}", getattr(self, field.name), low=0.0)


EFFORT_TERMS = tuple(f.name for f in dataclasses.fields(EffortWeights))


def effort(counts: Mapping[str, jnp.ndarray], weights: EffortWeights = EffortWeights()):
    """x_B = sum_i w_i * counts[i]_B over EFFORT_TERMS; a term with nonzero weight must be given."""
    unknown = sorted(set(counts) - set(EFFORT_TERMS))
    if unknown:
        raise ValueError(f"effort counts {unknown} are not among {list(EFFORT_TERMS)}")
    needed = [n for n in EFFORT_TERMS if getattr(weights, n) != 0.0]
    missing = [n for n in needed if n not in counts]
    if missing:
        raise ValueError(f"effort counts {missing} are missing but weighted in {weights}")
    if not needed:
        raise ValueError(f"EffortWeights are all zero: {weights}")
    arrays = [f32(counts[n]) for n in needed]
    chex.assert_rank(arrays, 1, custom_message="effort counts must each be [batch]")
    chex.assert_equal_shape(arrays, custom_message="effort counts must share one shape [batch]")
    return sum(getattr(weights, n) * c for n, c in zip(needed, arrays))
