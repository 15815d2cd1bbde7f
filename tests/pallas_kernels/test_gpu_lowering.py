"""The GPU (Triton) versions of the kernels lower on a CPU-only machine.

Cross-platform lowering runs the whole Pallas -> Triton IR translation of every kernel at the
benchmark's shapes, so unsupported operations, non-power-of-two tiles or dtype casts Triton lacks
fail here, without a GPU. (Triton's own compilation to PTX and the numerics need a GPU:
`pallas_kernels/bench_gpu.py`.)
"""

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import mxfp8 as pk
from pallas_kernels import router_replay as rr

TRITON_CALL = "__gpu$xla.gpu.triton"


def lower_for_cuda(f, *args) -> str:
    try:
        lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    except (ImportError, NotImplementedError) as e:  # jaxlib without the Triton dialect
        if "triton" in str(e).lower():
            pytest.skip(f"no Triton lowering in this jaxlib: {e}")
        raise
    return lowered.as_text()


def spec(shape, dtype):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("bs", [16, 32])
def test_quantize_and_matmul_lower_to_triton(bs):
    x = spec((512, 384), jnp.bfloat16)
    text = lower_for_cuda(lambda x: pk.quantize(x, bs, interpret=False), x)
    assert text.count(TRITON_CALL) == 1
    qa, sa = spec((256, 384), jnp.float8_e4m3fn), spec((256, 384 // bs), jnp.float8_e8m0fnu)
    qb, sb = spec((128, 384), jnp.float8_e4m3fn), spec((128, 384 // bs), jnp.float8_e8m0fnu)
    text = lower_for_cuda(
        lambda *ops: pk.matmul_nt(*ops, bs, out_dtype=jnp.bfloat16, interpret=False), qa, sa, qb, sb
    )
    assert text.count(TRITON_CALL) == 1


@pytest.mark.parametrize("score_func", ["sigmoid", "softmax"])
def test_router_replay_forward_and_backward_lower_to_triton(score_func):
    logits, idx = spec((1000, 256), jnp.bfloat16), spec((1000, 8), jnp.int32)
    kw = dict(
        score_func=score_func, norm_topk_prob=True, routed_scaling_factor=2.5, interpret=False
    )
    text = lower_for_cuda(lambda l, i: rr.router_replay(l, i, **kw), logits, idx)
    assert text.count(TRITON_CALL) == 2  # gates+counts, positions+scatter
    grad = lambda l, i: jax.grad(lambda l: rr.router_replay(l, i, **kw).gates_TK.sum())(l)
    assert lower_for_cuda(grad, logits, idx).count(TRITON_CALL) == 3  # + the backward kernel
