"""The router-replay Pallas kernel runs per device inside `jax.shard_map`: on 8 simulated devices
the compiled HLO has no all-gather of the kernel's operands (logits [T, E], indices [T, K]) and the
gates equal the unsharded call. A Pallas call has no partitioning rule; outside shard_map XLA
gathers its operands and runs the global call on every device (what the check would catch)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from c2 import model, sharding
from c2.model import moe

T_PER_DEVICE = 16


def _gathered_shapes(hlo: str) -> list[str]:
    return re.findall(r"=\s*(\S+)\s+all-gather(?:-start)?\(", hlo)


def _setup(shape):
    c = model.presets.get("tiny_qwen3_moe", dtype="float32", router_impl="pallas")
    mesh = sharding.make_mesh(**shape)
    p = jax.tree.map(lambda a: a[0], model.init_params(c, jax.random.key(0))["moe_layers"]["mlp"])
    n = mesh.size * T_PER_DEVICE
    x = jax.random.normal(jax.random.key(1), (n, c.d_model))
    tok = NamedSharding(mesh, P((*sharding.BATCH_AXES, "context")))
    return c, mesh, p, jax.device_put(x, tok), n


def _gates(c, mesh, n):
    def f(x, p):
        idx, gates, _, _ = moe.route(x, p, c, sorted_pairs=False, mesh=mesh)
        return gates, jax.grad(
            lambda x: jnp.sum(moe.route(x, p, c, sorted_pairs=False, mesh=mesh)[1] ** 2)
        )(x)

    return jax.jit(f)


@pytest.mark.parametrize(
    "shape", [dict(data=8), dict(fsdp=2, expert=4), dict(data=2, expert=2, context=2)], ids=str
)
def test_router_kernel_runs_per_device_without_gathering_its_operands(shape):
    c, mesh, p, x, n = _setup(shape)
    f = _gates(c, mesh, n)
    hlo = f.lower(x, p).compile().as_text()
    kernel_operands = {f"f32[{n},{c.n_experts}]", f"s32[{n},{c.n_experts_per_token}]"}
    kernel_operands |= {f"f32[{n},{c.n_experts_per_token}]"}
    gathered = {s.split("{")[0] for s in _gathered_shapes(hlo)}
    assert not gathered & kernel_operands, gathered
    assert "router_replay" in str(jax.make_jaxpr(f)(x, p))
    got = f(x, p)
    want = _gates(c.replace(router_impl="xla"), None, n)(np.asarray(x), p)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_outside_shard_map_the_kernel_operands_are_gathered():
    """The check has teeth: the same kernel called on the sharded arrays without shard_map."""
    c, mesh, p, x, n = _setup(dict(data=8))
    hlo = _gates(c, None, n).lower(x, p).compile().as_text()
    gathered = {s.split("{")[0] for s in _gathered_shapes(hlo)}
    assert gathered & {f"f32[{n},{c.n_experts}]", f"s32[{n},{c.n_experts_per_token}]"}, gathered
