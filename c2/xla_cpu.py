"""XLA:CPU compile options for training programs (the step, its forward, held-out evaluation).

`train_options()` is passed as `compiler_options` wherever c2 jits a training program. On the CPU
it turns XLA's YNNPACK fusions off, so dots run on Eigen and elementwise work in XLA's own
fusions. Measured on the tiny Kimi-K2 training step (forward + backward, 8 x 256 tokens,
float32, 2 cores; BENCHMARKS.md, "Training throughput"): the expert tiles' batched matmuls
([144, 64, 128] x [128, 96]) and attention's [256, 48] x [48, 256] products ran ~1.3-1.8x slower
as YNNPACK fusions than on Eigen, and the step took 1.3-1.5x as long. Decoding (a few rows per
call) is the other way round, slightly faster with YNNPACK, so the engine keeps XLA's defaults.

Only speed changes: Eigen and YNNPACK sum in different orders, so float32 results move in the
last bits (the tiny model's loss 5.7945123 -> 5.7945127). On GPU and TPU the options are empty.
"""

from __future__ import annotations

from c2.quant import target

# An empty list of fusion types: no YNNPACK fusions (XLA's DebugOptions, in jaxlib 0.10-0.11).
CPU_TRAIN_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def train_options(platform: str | None = None) -> dict[str, str]:
    """`compiler_options` for a training program compiled for `platform` (by default the one
    being compiled for: JAX's backend, or a device-less plan's GPU, c2.quant.target)."""
    return dict(CPU_TRAIN_OPTIONS) if (platform or target.platform()) == "cpu" else {}
