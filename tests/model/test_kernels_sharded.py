"""The Pallas kernels run per device inside `jax.shard_map`: on 8 simulated devices the compiled HLO
has no all-gather of the kernels' token operands (the router's logits [T, E] and indices [T, K];
the dense MXFP8 matmul's activations [T, K] and output gradient [T, M]) and the results equal the
unsharded call. A Pallas call has no partitioning rule; outside shard_map XLA gathers its operands
and runs the global call on every device (what the check would catch). Interpreted on the CPU a
kernel is plain HLO that XLA partitions, so the tests also check each `pallas_call`'s place: in a
shard_map, for the whole model's loss and gradient."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from c2 import model, sharding
from c2.model import layers, moe

T_PER_DEVICE = 16


def _gathered_shapes(hlo: str) -> list[str]:
    return re.findall(r"=\s*(\S+)\s+all-gather(?:-start)?\(", hlo)


def _pallas_calls(jaxpr, inside=False) -> list[bool]:
    """For each pallas_call in `jaxpr` (nested jaxprs included): whether it runs in a shard_map.

    On the CPU the kernels run interpreted, as ordinary HLO that XLA partitions, so the compiled
    HLO alone cannot show a kernel that a GPU would run on gathered operands: its place in the
    program can."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append(inside)
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    found += _pallas_calls(sub, inside or eqn.primitive.name == "shard_map")
    return found


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
    calls = _pallas_calls(jax.make_jaxpr(f)(x, p).jaxpr)
    assert calls and all(calls), calls
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


def _dense(mesh, impl="pallas"):
    """layers.linear in MXFP8 (the Pallas kernels: quantise, matmul, and both gradient GEMMs):
    y and the gradients of sum(y^2) with respect to x and w."""
    c = model.presets.get("tiny_qwen3_moe", dtype="float32", quant="mxfp8", mxfp8_impl=impl)

    def f(x, w):
        def loss(x, w):
            return jnp.sum(layers.linear(x, w, c, mesh=mesh) ** 2)

        return layers.linear(x, w, c, mesh=mesh), *jax.grad(loss, argnums=(0, 1))(x, w)

    return jax.jit(f)


@pytest.mark.parametrize("shape", [dict(data=8), dict(fsdp=4, expert=2)], ids=str)
def test_dense_mxfp8_kernels_run_per_device_without_gathering_the_tokens(shape):
    mesh = sharding.make_mesh(**shape)
    n, k, m = mesh.size * T_PER_DEVICE, 64, 96
    x = jax.random.normal(jax.random.key(0), (n, k))
    w = jax.random.normal(jax.random.key(1), (k, m)) / 8
    x = jax.device_put(x, NamedSharding(mesh, P(sharding.TOKEN_AXES)))
    w = jax.device_put(w, sharding.named_sharding(mesh, ("embed", "mlp")))  # FSDP: gathered
    f = _dense(mesh)
    hlo = f.lower(x, w).compile().as_text()
    gathered = {s.split("{")[0] for s in _gathered_shapes(hlo)}
    assert not gathered & {f"f32[{n},{k}]", f"f32[{n},{m}]"}, gathered
    calls = _pallas_calls(jax.make_jaxpr(f)(x, w).jaxpr)
    assert len(calls) >= 4 and all(calls), calls  # quantise, y, dx and dw
    got = f(x, w)
    want = _dense(None)(np.asarray(x), np.asarray(w))  # the same kernels, unsharded
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    # and MXFP8, not a plain matmul: the XLA ops of the same format agree to its rounding
    ref = _dense(None, impl="xla")(np.asarray(x), np.asarray(w))
    exact = np.asarray(x) @ np.asarray(w)
    assert np.abs(np.asarray(got[0]) - exact).max() > 1e-4
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(ref[0]), rtol=1e-2, atol=1e-2)


def test_outside_shard_map_the_dense_kernel_operands_are_gathered():
    mesh = sharding.make_mesh(data=8)
    n, k, m = mesh.size * T_PER_DEVICE, 64, 96
    x = jax.device_put(jnp.ones((n, k)), NamedSharding(mesh, P(sharding.TOKEN_AXES)))
    w = jnp.ones((k, m))
    f = _dense(None)
    hlo = f.lower(x, w).compile().as_text()
    gathered = {s.split("{")[0] for s in _gathered_shapes(hlo)}
    assert f"f32[{n},{k}]" in gathered, gathered
    calls = _pallas_calls(jax.make_jaxpr(f)(x, w).jaxpr)
    assert calls and not any(calls), calls


def _moe(c, mesh):
    def f(x, p):
        seg = jnp.ones(x.shape[:2], jnp.int32)
        y = moe.moe_block(x, p, c, seg, mesh=mesh)[0]
        return y, jax.grad(lambda x: jnp.sum(moe.moe_block(x, p, c, seg, mesh=mesh)[0] ** 2))(x)

    return jax.jit(f)


@pytest.mark.parametrize("shape", [dict(data=8), dict(data=2, fsdp=2, context=2)], ids=str)
def test_grouped_mxfp8_kernels_run_per_device_without_gathering_the_tokens(shape):
    """Without expert parallelism each device dispatches its own tokens (dropless) to the whole
    experts: the Pallas grouped kernels see [local rows, H], never the gathered tokens."""
    c = model.presets.get("tiny_qwen3_moe", dtype="float32", quant="mxfp8", mxfp8_impl="pallas")
    mesh = sharding.make_mesh(**shape)
    p = jax.tree.map(lambda a: a[0], model.init_params(c, jax.random.key(0))["moe_layers"]["mlp"])
    B, T = 8, 2 * T_PER_DEVICE
    x = jax.random.normal(jax.random.key(1), (B, T, c.d_model))
    x = jax.device_put(x, sharding.named_sharding(mesh, ("batch", "seq", None)))
    f = _moe(c, mesh)
    hlo = f.lower(x, p).compile().as_text()
    gathered = {s.split("{")[0] for s in _gathered_shapes(hlo)}
    tokens = {f"f32[{B * T},{c.d_model}]", f"f32[{B},{T},{c.d_model}]"}
    assert not gathered & tokens, gathered
    calls = _pallas_calls(jax.make_jaxpr(f)(x, p).jaxpr)
    assert len(calls) >= 6 and all(calls), calls  # quantise + grouped GEMMs, forward and backward
    got = f(x, p)
    want = _moe(c, None)(np.asarray(x), p)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [dict(data=8), dict(fsdp=4, expert=2)], ids=str)
def test_every_kernel_of_the_model_runs_in_a_shard_map(shape):
    """The whole model (MLA, dense and MoE layers, MTP) with every Pallas kernel on: each call in
    the loss's forward and backward sits in a shard_map (traced only: no kernel is compiled)."""
    c = model.presets.get(
        "tiny_kimi_k2", dtype="float32", quant="mxfp8", mxfp8_impl="pallas", router_impl="pallas"
    )
    mesh = sharding.make_mesh(**shape)
    p = model.init_params(c, jax.random.key(0), mesh)
    toks = jax.device_put(
        jnp.zeros((8, 2 * T_PER_DEVICE), jnp.int32), sharding.batch_sharding(mesh)
    )

    def loss(p):
        logits, aux = model.forward(p, toks, c, mesh=mesh)
        return jnp.mean(logits) + jnp.mean(model.mtp_logits(p, aux, c))

    calls = _pallas_calls(jax.make_jaxpr(jax.grad(loss))(p).jaxpr)
    assert len(calls) > 20 and all(calls), (len(calls), calls.count(False))
