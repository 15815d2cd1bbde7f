"""GPU check of the Pallas kernels inside the model: pallas_kernels/bench_gpu.py (every kernel
against its reference, then speed) with one more check, the tiny Kimi-K2 with the kernels switched
on (router_impl, then also mxfp8_impl "pallas") vs XLA ops: loss and every gradient.

    python -m c2.bench.kernels_gpu --out DIR    # bench_gpu.py's flags; writes DIR/bench_gpu.json

Here, not in pallas_kernels/, because the kernels stand alone and know no model.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from c2 import model
from pallas_kernels import bench_gpu


def tiny_model_check(report, key, shrink: int = 1) -> None:
    """The model-level section of the check (an `extra_checks` entry of bench_gpu.main)."""
    with report.guard("tiny model with the kernels"):
        # A shrunk (smoke) run keeps one dense and one MoE layer, no MTP block: interpret-mode
        # kernels compile per layer, and tests/model/test_model_kernels.py covers the whole tiny
        # model (MTP block included).
        smoke = shrink > 1
        check_model(
            report,
            key,
            toks_shape=(4, max(17, 256 // shrink)),
            n_layers=2 if smoke else 4,
            mtp_depth=0 if smoke else 1,
        )


def rel_l2(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def check_model(report, key, toks_shape, n_layers: int = 4, mtp_depth: int = 1):
    """The tiny Kimi-K2 with the kernels on vs XLA ops: loss and every parameter's gradient.

    Router replay (float32 model): equal to float32 rounding. MXFP8 cannot be compared that way:
    a last-bit difference in any partial sum (FP8 tensor cores sum in another order than XLA)
    flips later E4M3 roundings, and gradients move by percents (15% on some leaves at init on
    CPU). So each MXFP8 implementation is measured against the unquantised model instead: the
    kernels' gradient error must be about the XLA path's (a broken kernel is O(1) away).
    """
    c = model.presets.get("tiny_kimi_k2", dtype="float32", n_layers=n_layers, mtp_depth=mtp_depth)
    params = model.init_params(c, key)
    toks = jax.random.randint(key, toks_shape, 0, c.vocab_size, jnp.int32)

    def loss(p, c):
        logits, _ = model.forward(p, toks, c)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - logits[..., 7])

    step = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    want, got = step(params, c), step(params, c.replace(router_impl="pallas"))
    errs = [
        bench_gpu.max_rel_err(g, w) for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))
    ]
    report.check("tiny_model_router_kernel_vs_xla", max(errs) < 1e-4, max_err=max(errs))
    exact = jax.tree.leaves(step(params, c.replace(dtype="bfloat16"))[1])
    c = c.replace(dtype="bfloat16", quant="mxfp8")
    xla = step(params, c)
    kernels = step(params, c.replace(mxfp8_impl="pallas", router_impl="pallas"))
    loss_err = abs(float(kernels[0]) - float(xla[0])) / abs(float(xla[0]))
    worst = 0.0  # largest excess of the kernels' gradient error over the XLA path's
    for e, x, k in zip(exact, jax.tree.leaves(xla[1]), jax.tree.leaves(kernels[1])):
        if float(jnp.linalg.norm(e)) > 0:
            worst = max(worst, rel_l2(k, e) - 1.5 * rel_l2(x, e))
    report.check(
        "tiny_model_mxfp8_kernels_vs_xla",
        loss_err < 1e-3 and worst < 0.02,
        loss_err=loss_err,
        grad_error_excess=worst,
    )


def main(argv=None):
    return bench_gpu.main(argv, extra_checks=(tiny_model_check,))


if __name__ == "__main__":
    main()
