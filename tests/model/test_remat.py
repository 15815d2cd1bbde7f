"""Remat (`ModelConfig.remat`) changes no value: loss and every gradient equal the model without
it, on the GPU's rolled layer loop (`target.as_backend("gpu")`, as in training there), with a
one-layer dense stack (rematerialised with CSE prevented: XLA removes a loop of one trip) and the
MTP module (rematerialised as a whole block outside the scan). What remat keeps is measured where
it matters, at real widths, by `python -m c2.bench.plan` (BENCHMARKS.md); at this size a CPU
compile's temporaries are dominated by other buffers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from c2 import model
from c2.quant import target


def _loss_and_grads(cfg, params, toks):
    def loss(p):
        logits, aux = model.forward(p, toks, cfg)
        total = jnp.mean(jax.nn.logsumexp(logits, -1))
        if cfg.mtp_depth:
            total = total + jnp.mean(aux["mtp_hidden"] ** 2)
        return total

    with target.as_backend("gpu"):
        return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("mtp_depth", [0, 1])
def test_remat_changes_no_value(mtp_depth):
    cfg = model.presets.get(
        "tiny_kimi_k2", dtype="float32", n_layers=3, first_k_dense=1, mtp_depth=mtp_depth
    )
    params = model.init_params(cfg, jax.random.key(0))
    toks = jax.random.randint(jax.random.key(1), (2, 64), 0, cfg.vocab_size, jnp.int32)
    v0, g0 = _loss_and_grads(cfg.replace(remat=False), params, toks)
    v1, g1 = _loss_and_grads(cfg.replace(remat=True), params, toks)
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
