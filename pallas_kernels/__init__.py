"""Pallas kernels of c2, each with its pure-jnp reference in the same file.

- `pallas_kernels.mxfp8`: one-pass row/column MXFP8 quantise and the block-scaled FP8 matmul.
- `pallas_kernels.router_replay`: gates, per-expert counts/offsets and the expert-sorted
  permutation for forced (replayed) or live top-k routing, with a custom_vjp to the router logits.

GPU kernels use the Triton backend of Pallas; on CPU they run in `interpret=True` mode (the
default there). `pallas_kernels/bench_gpu.py` checks and times them on a GPU.
"""

from c2.quant import target


def default_interpret() -> bool:
    """Pallas kernels run interpreted on CPU (the only way they run there); compiled when the
    program is compiled for a GPU (`c2.quant.target.compiling_for`, device-less)."""
    return target.platform() == "cpu"


def resolve_interpret(interpret: bool | None) -> bool:
    return default_interpret() if interpret is None else bool(interpret)
