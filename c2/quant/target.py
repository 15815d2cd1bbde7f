"""The backend whose code paths the model and the MXFP8 ops take.

Normally the one JAX runs on. `c2.bench.plan` compiles the GPU's layout (ragged expert exchange,
`ragged_dot` grouped matmuls, bf16 dequantised MXFP8 operands) on simulated CPU devices, to read
XLA's memory and cost analyses for the real mesh; `as_backend("gpu")` selects those paths while
the step is traced. Tracing only: what is compiled still runs on the real backend.
"""

from __future__ import annotations

import contextlib

import jax

_OVERRIDE: list[str] = []


def backend() -> str:
    """ "cpu", "gpu" or "tpu": the override while `as_backend` is active, else JAX's backend."""
    return _OVERRIDE[-1] if _OVERRIDE else jax.default_backend()


@contextlib.contextmanager
def as_backend(name: str | None):
    """Trace for `name`'s code paths (None: no override)."""
    if name is None:
        yield
        return
    if name not in ("cpu", "gpu", "tpu"):
        raise ValueError(f"backend {name!r}: expected cpu, gpu or tpu")
    _OVERRIDE.append(name)
    try:
        yield
    finally:
        _OVERRIDE.pop()
