"""Config choices picked by name (Tunix `rl/` style), and the input checks objectives share."""

from collections.abc import Callable, Iterable
from numbers import Real

import chex
import jax.numpy as jnp
import numpy as np


class Registry:
    """A name -> function table for one config field (e.g. `aggregation`)."""

    def __init__(self, field: str):
        self.field = field
        self._fns: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[Callable], Callable]:
        def add(fn: Callable) -> Callable:
            if name in self._fns:
                raise ValueError(f"{self.field}: {name!r} is registered twice")
            self._fns[name] = fn
            return fn

        return add

    def get(self, name: str) -> Callable:
        check_choice(self.field, name, self._fns)
        return self._fns[name]

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._fns))

    def __contains__(self, name: str) -> bool:
        return name in self._fns


def check_choice(field: str, value, options: Iterable[str]) -> None:
    """Fails early on an unknown config string, naming the field and the valid options."""
    options = sorted(options)
    if value not in options:
        raise ValueError(f"{field}={value!r} is not one of {options}")


def check_number(field: str, value, *, low=None, high=None, low_open=False, high_open=False):
    """Range-checks a Python/numpy number; traced values are left to the caller (cannot be read)."""
    if not isinstance(value, Real | np.ndarray | np.generic):
        return
    v = np.asarray(value)
    bad_low = low is not None and (np.any(v <= low) if low_open else np.any(v < low))
    bad_high = high is not None and (np.any(v >= high) if high_open else np.any(v > high))
    if bad_low or bad_high or np.any(np.isnan(v)):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        interval = f"{'(' if low_open else '['}{lo}, {hi}{')' if high_open else ']'}"
        raise ValueError(f"{field}={value!r} must lie in {interval}")


def f32(x) -> jnp.ndarray:
    """Every objective computes in float32, whatever the input dtype (bf16 logprobs included)."""
    return jnp.asarray(x).astype(jnp.float32)


def check_tokens(mask_BT, **arrays_BT) -> None:
    """Asserts [B, T] arrays that share the padding mask's shape; names the offending argument."""
    chex.assert_rank(mask_BT, 2, custom_message="mask_BT must be [batch, time]")
    for name, x in arrays_BT.items():
        if x is not None:
            chex.assert_shape(
                x, mask_BT.shape, custom_message=f"{name} must have mask_BT's shape {mask_BT.shape}"
            )


def masked(x, mask) -> jnp.ndarray:
    """float32 x with padding set to 0 *before* any math: garbage (even NaN) there cannot leak
    into values or gradients (where() after the math would still backpropagate 0 * NaN)."""
    return jnp.where(f32(mask) > 0, f32(x), 0.0)
