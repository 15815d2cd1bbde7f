"""The machine's measured matmul peak, the denominator of every MFU c2 reports.

Measured by the trainer for its MFU (below the benchmarks, which read it too);
`python -m c2.bench.peak` prints it for float32 and bfloat16 on the default backend.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp


@functools.cache
def host_matmul_peak_flops(dtype: str = "float32", n: int | None = None, reps: int = 5) -> float:
    """Best FLOP/s of an n x n x n matmul on the first local device (best of `reps` timed runs)."""
    dev = jax.local_devices()[0]
    if n is None:
        n = 8192 if dev.platform == "gpu" else 1024
    a = jax.device_put(jnp.ones((n, n), dtype), dev)
    b = jax.device_put(jnp.ones((n, n), dtype), dev)
    # A short chain keeps dispatch overhead out of the measurement.
    f = jax.jit(
        lambda a, b: jnp.dot(
            jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype),
            b,
            preferred_element_type=jnp.float32,
        )
    )
    f(a, b).block_until_ready()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        f(a, b).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * 2 * n**3 / best


def matmul_peak_flops(dtype: str = "float32") -> float:
    """Measured peak per device. Simulated CPU devices share the host's cores, so on CPU the
    host's peak is split evenly among them (peak x n_devices = the machine)."""
    peak = host_matmul_peak_flops(dtype)
    if jax.local_devices()[0].platform == "cpu":
        peak /= jax.local_device_count()
    return peak
