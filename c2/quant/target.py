"""The backend whose code paths the model and the MXFP8 ops take, and the platform it compiles for.

Normally both are the one JAX runs on. `c2.bench.plan` traces the GPU's layout (`ragged_dot`
grouped matmuls, bf16 dequantised MXFP8 operands, the rolled layer loop) while JAX runs on the
CPU, to read XLA's memory and cost analyses for the real mesh:
  - `as_backend("gpu")` selects those code paths; what is compiled is still for the CPU, so ops
    XLA:CPU cannot compile (`ragged_all_to_all`, cuDNN attention, bf16 x bf16 -> f32 dots) keep
    their CPU form (`platform()` is still "cpu").
  - `compiling_for("gpu")` also says the program is compiled for a GPU (device-less, for a
    `jax.experimental.topologies` mesh): `platform()` is "gpu", so those ops take their GPU form.
Tracing only: neither changes where anything runs.
"""

from __future__ import annotations

import contextlib

import jax

_BACKENDS = ("cpu", "gpu", "tpu")
_OVERRIDE: list[str] = []
_PLATFORM: list[str] = []


def backend() -> str:
    """ "cpu", "gpu" or "tpu": the override while `as_backend` is active, else JAX's backend."""
    return _OVERRIDE[-1] if _OVERRIDE else jax.default_backend()


def platform() -> str:
    """The platform the traced program is compiled for: `compiling_for`'s, else JAX's backend."""
    return _PLATFORM[-1] if _PLATFORM else jax.default_backend()


def _check(name: str) -> None:
    if name not in _BACKENDS:
        raise ValueError(f"backend {name!r}: expected one of {', '.join(_BACKENDS)}")


@contextlib.contextmanager
def _pushed(stack: list[str], name: str | None):
    """`name` on top of `stack` while active (None: nothing pushed)."""
    if name is None:
        yield
        return
    _check(name)
    stack.append(name)
    try:
        yield
    finally:
        stack.pop()


def as_backend(name: str | None):
    """Trace for `name`'s code paths (None: no override)."""
    return _pushed(_OVERRIDE, name)


@contextlib.contextmanager
def compiling_for(name: str | None):
    """Trace for `name`'s code paths and its compiler (None: no override)."""
    with _pushed(_PLATFORM, name), _pushed(_OVERRIDE, name):
        yield
