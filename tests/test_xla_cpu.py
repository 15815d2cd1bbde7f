"""c2/xla_cpu.py: training programs compile without XLA:CPU's YNNPACK fusions."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from c2 import model, xla_cpu
from c2.quant import target
from c2.train import bpb
from c2.train.step import compile_step, make_step_fn


def _ynn(compiled) -> bool:
    """Whether the compiled program has a YNNPACK fusion (`%ynn_fusion... = ... fusion(`)."""
    return "%ynn_fusion" in compiled.as_text()


def test_options_only_for_cpu_programs():
    assert xla_cpu.train_options("cpu") == {"xla_cpu_experimental_ynn_fusion_type": ""}
    assert xla_cpu.train_options("gpu") == {} and xla_cpu.train_options("tpu") == {}
    with target.compiling_for("gpu"):  # a device-less GPU plan gets no CPU options
        assert xla_cpu.train_options() == {}


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU options")
def test_train_step_and_eval_compile_without_ynnpack():
    cfg = model.presets.get("tiny_kimi_k2", dtype="float32", mtp_depth=0)
    x = jnp.ones((8, 64), jnp.float32)
    matmul = jax.jit(lambda a: jnp.tanh(a @ a.T))
    if not _ynn(matmul.lower(x).compile()):
        pytest.skip("this jaxlib does not fuse into YNNPACK by default")
    options = xla_cpu.train_options()
    assert not _ynn(matmul.lower(x).compile(compiler_options=options))

    params = model.init_params(cfg, jax.random.key(0))

    def loss_fn(p, batch, rng):
        logits, _ = model.forward(p, batch["inputs"], cfg)
        return jnp.mean(jax.nn.logsumexp(logits, -1)), ({}, None)

    tx = optax.sgd(1e-3)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    params = jax.device_put(params, replicated)
    opt_state = jax.device_put(tx.init(params), replicated)
    ids = jnp.zeros((2, 16), jnp.int32)
    batch = {
        "inputs": ids, "targets": ids, "positions": ids, "segment_ids": ids + 1,
        "loss_mask": ids, "target_bytes": ids,
    }  # fmt: skip
    rng = jax.random.key_data(jax.random.key(1))
    step_fn = make_step_fn(loss_fn, tx, optax.constant_schedule(1e-3))
    assert not _ynn(compile_step(step_fn, params, opt_state, rng, batch, batch_sharding=replicated))
    assert not _ynn(bpb._eval_fn(cfg, None).lower(params, batch).compile())
