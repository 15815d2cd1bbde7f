"""The per-device memory and compute plan of one training step, from XLA's own analyses.

    python -m c2.bench.plan --config=experiments/cpt_kimi_k2.py [--device_memory_gb 141]
    python -m c2.bench.plan --config=experiments/long_context_kimi_k2.py --device_memory_gb 288
    python -m c2.bench.plan --config=experiments/rl_kimi_k2.py

Lowers and compiles one training step (loss, gradient, optimiser update, router-bias rule; the
config's remat policy, optimiser, dtypes, quantisation, attention and expert-exchange choices) for
the config's real mesh on simulated CPU devices (`--xla_force_host_platform_device_count` set to
the mesh size before JAX starts), with abstract inputs only (`jax.ShapeDtypeStruct`: nothing is
allocated). The model is reduced to a few layers at real widths (vocabulary, d_model, experts,
heads): d0 = min(n_dense, 2) dense and m0 = min(n_moe, 2) MoE layers (plus the MTP module, which
the real model has once), then one MoE layer more (and one dense layer more when the model has
more than d0), so that a layer's increment is measured, not guessed. Every per-layer quantity is
then scaled by the layer counts:

    X(full) = X(d0, m0) + (n_moe - m0) [X(d0, m0+1) - X(d0, m0)]
                        + (n_dense - d0) [X(d0+1, m0) - X(d0, m0)]

(X(d, m): the step compiled with d dense and m MoE layers). Two layers, not one: XLA removes a
layer loop of one trip, and in the straight-line code that is left the recomputation of a
`jax.checkpoint(prevent_cse=False)` layer is merged with its forward, so remat is lost; a group
the real model has once (Kimi-K2's one dense layer) is measured as it is. The layer loop is
traced rolled, as on the GPU (`as_backend("gpu")`; XLA:CPU runs unroll it, with the same loss of
remat).

for the temporary bytes (activations kept for the backward pass plus the working set), the FLOPs
and the collectives. Parameter and optimiser bytes are exact from the full model's shard shapes.
Per-device total = parameters + optimiser state + batch + temporaries (outputs alias the donated
state). The activation share is the per-layer increment times the layer count (what remat keeps);
the remainder of the temporaries is the step's working set (one layer's recomputation, logits,
loss, gradient buffers).

The RL config is planned as its training micro-batch (`rl.micro_batch_size` sequences of the
longest `rl.seq_buckets` length) under the language-model loss: the policy-gradient loss has the
same forward/backward and a few [B, T] arrays more.

The expert grouped matmul: XLA:CPU lowers `ragged_dot` / `ragged_dot_general` to a dense
[G, M, N] product masked per group (G = 48 local experts at Kimi-K2's layout: 840 GiB for one
[48, 655360, 7168] float32 array), buffers and FLOPs a GPU grouped GEMM never has; compiled as
it is, the reduced CPT step reads 5.3 TB of temporaries. So the plan (and only the plan: training
never enters `grouped_gemm_standin`) compiles a stand-in for it (`--grouped_gemm standin`, the
default; `xla` keeps the CPU lowering):
  - preserved: every operand and result shape and dtype (forward y [M, N] in x's dtype; backward
    dx [M, K], dw [G, K, N] in w's dtype; MXFP8: the quantise/dequantise of every operand, which
    is real work, stays as it is); the FLOPs of a grouped GEMM over M rows, 2 M K N per GEMM
    (forward, input gradient, weight gradient), plus G K N adds; no buffer larger than an
    operand or a result.
  - not preserved: the values. The forward multiplies x by the sum of the groups' weights, the
    weight gradient is x^T dy broadcast to every group; the rows are not split by group.
`tests/bench/test_plan_standin.py` checks shapes, dtypes and cost_analysis FLOPs against the real
op (one group, where XLA:CPU's ragged_dot is the dense GEMM). The whole-model comparison in
`tests/bench/test_plan.py` compiles both sides with the stand-in: it checks the layer scaling,
which must hold for whatever the grouped matmul compiles to, and without the stand-in the small
model's temporaries would be mostly the CPU's expansion.

CPU compilation stands in for the GPU's: the buffer assignment and fusion differ (XLA:CPU keeps
some elementwise intermediates of the MXFP8 quantise that a GPU fusion would not), the CPU runs
the padded expert exchange, so the numbers are an estimate, not a measurement on the GPU.
`--compile_for h200` (or b300) compiles the same reduced steps with XLA:GPU instead, device-less,
for a topology of that many GPUs (the CUDA PJRT plugin: `pip install -e ".[gpu-compile]"`; no
GPU): the GPU's own ops, buffer assignment and scheduling, but no cost analysis (FLOPs None).
The last line printed is JSON with `per_device_bytes` and `fits`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import time

GROUPED_GEMM = ("standin", "xla")

# Device-less GPU compiles (`--compile_for`): XLA's GpuTargetConfig of each GPU, and its memory in
# GB. What the memory plan depends on is the compute capability (the kernels XLA may emit) and
# `device_memory_size` (the budget of XLA's scheduler and rematerialisation); the rest steers
# autotuning-free cost models only. The CUDA 12.8 / cuDNN 9.8 runtime assumed is older than the
# jax[cuda12] 0.10 wheels' (12.9 / 9.28), so no newer library kernel than a cluster's is chosen.
# B300 is compiled for compute capability 10.0 (Blackwell's sm_100) with its 288 GB.
_GPU_TARGET = """gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: {sms}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: {l2}
  clock_rate_ghz: {clock}
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: {cc_major} minor: {cc_minor} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
runtime_version {{ major: 12 minor: 8 }}
device_description_str: "{name}"
"""
GPU_TARGETS = {
    "h200": dict(
        name="NVIDIA H200",
        sms=132,
        bandwidth=4_800_000_000_000,
        l2=52_428_800,
        clock=1.98,
        memory=150_754_820_096,
        cc_major=9,
        cc_minor=0,
        memory_gb=141.0,
    ),
    "b300": dict(
        name="NVIDIA B300",
        sms=148,
        bandwidth=8_000_000_000_000,
        l2=134_217_728,
        clock=1.92,
        memory=288_000_000_000,
        cc_major=10,
        cc_minor=0,
        memory_gb=288.0,
    ),
}
COLLECTIVES = (
    "all-gather",
    "all-to-all",
    "ragged-all-to-all",
    "reduce-scatter",
    "all-reduce",
    "collective-permute",
)
_COLLECTIVE_RE = re.compile(
    r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(.*?)\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(",
    re.MULTILINE,
)


def gpu_devices(name: str, n: int):
    """`n` device-less GPUs of kind `name` (GPU_TARGETS), 8 per host, for compiling only: needs
    the CUDA PJRT plugin (`pip install "jax[cuda12]"`), not a GPU. JAX must run on the CPU, or
    the plugin looks for GPUs when the backends start: this puts it there when they have not
    started yet (otherwise start them with JAX_PLATFORMS=cpu)."""
    import jax

    if name not in GPU_TARGETS:
        raise ValueError(f"compile_for={name!r}: expected cpu or one of {sorted(GPU_TARGETS)}")
    if n % 8 and n > 8:
        raise ValueError(f"{n} GPUs: expected at most 8, or a multiple of 8 (8 per host)")
    from jax._src import xla_bridge
    from jax.experimental import topologies

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")  # JAX_PLATFORMS may have been set after import
    spec = GPU_TARGETS[name]
    hosts, per_host = (1, n) if n <= 8 else (n // 8, 8)
    try:
        topo = topologies.get_topology_desc(
            platform="cuda",
            target_config=_GPU_TARGET.format(**spec),
            topology=f"1x{hosts}x{per_host}",
        )
    except Exception as e:  # the plugin is missing, or too old for device-less topologies
        raise RuntimeError(
            f"a device-less {spec['name']} compile needs the CUDA PJRT plugin of jax "
            f'{jax.__version__}: pip install "jax[cuda12]=={jax.__version__}" ({e})'
        ) from e
    return list(topo.devices)


def _mesh_size(config) -> int:
    from c2.train.config import MESH_AXES

    return math.prod(int(config.mesh[a]) for a in MESH_AXES)


def _is_rl(config) -> bool:
    return "rl" in config


def stage_shapes(config):
    """(stage config the LM trainer understands, global batch, sequence length)."""
    if _is_rl(config):
        from c2.rl.config import _without_rl

        base = _without_rl(config)
        return base, int(config.rl.micro_batch_size), int(max(config.rl.seq_buckets))
    return config, int(config.data.batch_size), int(config.data.seq_len)


def _shape_bytes(text: str) -> int:
    """Bytes of an HLO result shape such as `bf16[2,4]{1,0}` or a tuple of them."""
    sizes = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4}
    sizes |= {"s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
    sizes |= {"f8e8m0fnu": 1}
    total = 0
    for dt, dims in re.findall(r"([a-z0-9]+)\[([0-9,]*)\]", text):
        n = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += n * sizes.get(dt, 4)
    return total


# The grouped-GEMM stand-in ----------------------------------------------------------------------


def _standin_dot(x_MK, w_GKN, group_sizes_G=None):
    """[M, K] x [G, K, N] -> [M, N] float32 as one dense dot against the sum of the groups'
    weights: 2 M K N FLOPs (what a grouped GEMM does for M rows) plus G K N adds that keep every
    weight element read (so an MXFP8 quantise of the weights is not trimmed to one group)."""
    del group_sizes_G
    return _dot_f32(x_MK, w_GKN.sum(0))


def _dot_f32(a, b):
    import jax.numpy as jnp

    return jnp.dot(a, b, preferred_element_type=jnp.float32)


def _standin_xt_dy(x_MK, dy_MN, group_sizes_G):
    """The weight gradient [G, K, N] float32 of a grouped GEMM (dw[g] = x_g.T dy_g): one
    [K, M] x [M, N] dot, 2 M K N FLOPs, broadcast to the G groups (every group gets the sum)."""
    import jax.numpy as jnp

    G = group_sizes_G.shape[0]
    return jnp.broadcast_to(_dot_f32(x_MK.T, dy_MN), (G, *x_MK.shape[1:], dy_MN.shape[1]))


def _make_standin_ragged():
    """moe._ragged for bf16 experts: the stand-in with a custom VJP (dx, dw; none for sizes)."""
    import jax

    @jax.custom_vjp
    def ragged(x_MK, w_GKN, group_sizes_G):
        return _standin_dot(x_MK, w_GKN).astype(x_MK.dtype)

    def fwd(x_MK, w_GKN, group_sizes_G):
        return ragged(x_MK, w_GKN, group_sizes_G), (x_MK, w_GKN, group_sizes_G)

    def bwd(res, dy_MN):
        x_MK, w_GKN, group_sizes_G = res
        dx = _dot_f32(dy_MN, w_GKN.sum(0).T).astype(x_MK.dtype)
        dw = _standin_xt_dy(x_MK, dy_MN, group_sizes_G).astype(w_GKN.dtype)
        return dx, dw, None

    ragged.defvjp(fwd, bwd)
    return ragged


def _grouped_gemm(kind: str):
    return grouped_gemm_standin() if kind == "standin" else contextlib.nullcontext()


@contextlib.contextmanager
def grouped_gemm_standin():
    """While active (tracing for the plan only; training never enters it), the expert grouped
    matmuls compile as stand-ins with a GPU grouped GEMM's buffers and FLOPs (see the module
    doc): `c2.model.moe._ragged` (bf16 experts) and, inside `mxfp8_ragged_dot`'s custom VJP,
    `c2.quant.mxfp8._ragged_f32` (forward and input gradient) and `_grouped_xt_dy` (weight
    gradient). The MXFP8 quantise/dequantise around them is kept as it is."""
    import jax.numpy as jnp

    from c2.model import moe
    from c2.quant import mxfp8

    standin_bf16 = _make_standin_ragged()
    real_ragged = moe._ragged

    def ragged(x, w, group_sizes, c):
        if c.quant == "mxfp8":
            return real_ragged(x, w, group_sizes, c)
        dtype = jnp.dtype(c.dtype)
        return standin_bf16(x.astype(dtype), w.astype(dtype), group_sizes)

    saved = (moe._ragged, mxfp8._ragged_f32, mxfp8._grouped_xt_dy)
    moe._ragged = ragged
    mxfp8._ragged_f32 = _standin_dot
    mxfp8._grouped_xt_dy = _standin_xt_dy
    try:
        yield
    finally:
        moe._ragged, mxfp8._ragged_f32, mxfp8._grouped_xt_dy = saved


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """Count and result bytes of each collective in compiled HLO text (async pairs once)."""
    out = {k: {"count": 0, "bytes": 0} for k in COLLECTIVES}
    for shape, op in _COLLECTIVE_RE.findall(hlo_text):
        out[op]["count"] += 1
        out[op]["bytes"] += _shape_bytes(re.sub(r"/\*[^*]*\*/", "", shape))
    return out


@dataclasses.dataclass
class Measured:
    """What one compile of the step reports, per device."""

    argument: int
    output: int
    alias: int
    temp: int
    flops: float
    collectives: dict
    compile_s: float

    def minus(self, other: Measured) -> dict:
        return {
            "temp": self.temp - other.temp,
            "flops": self.flops - other.flops,
            "collectives": {
                k: {f: self.collectives[k][f] - other.collectives[k][f] for f in ("count", "bytes")}
                for k in COLLECTIVES
            },
        }


def _tree_bytes(tree) -> int:
    import jax
    import jax.numpy as jnp

    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


def abstract_state(cfg, config, mesh):
    """Sharded abstract params and optimiser state of `cfg` (nothing allocated)."""
    import jax

    from c2 import model as model_lib
    from c2.train.config import sharding_rules
    from c2.train.loop import opt_state_shardings
    from c2.train.optimizer import make_optimizer

    rules = sharding_rules(config)
    shardings = model_lib.param_shardings(cfg, mesh, rules)
    params = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        model_lib.abstract_params(cfg),
        shardings,
    )
    tx, schedule = make_optimizer(config.optimizer, config.train.steps, params)
    opt = jax.eval_shape(tx.init, params)
    opt_sh = opt_state_shardings(opt, params, mesh)
    opt = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), opt, opt_sh)
    return params, opt, tx, schedule


def compile_step(cfg, config, mesh, batch: int, seq: int):
    """The compiled train step of `cfg` on `mesh` for abstract inputs."""
    import functools

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from c2 import model as model_lib
    from c2 import sharding
    from c2.train import lm
    from c2.train.config import sharding_rules
    from c2.train.step import make_step_fn

    params, opt, tx, schedule = abstract_state(cfg, config, mesh)
    layout = sharding.as_layout(mesh, sharding_rules(config))  # activations follow the rules too
    tc = config.train
    post = None
    if cfg.n_moe_layers and tc.router_bias_rate:
        post = lambda p, aux: model_lib.update_router_bias(p, aux, cfg, tc.router_bias_rate)  # noqa: E731
    loss_fn = functools.partial(lm.lm_loss, cfg=cfg, tc=tc, mesh=layout)
    step_fn = make_step_fn(loss_fn, tx, schedule, post, micro_batches=tc.micro_batches)
    bs = sharding.batch_sharding(layout)
    tok = jax.ShapeDtypeStruct((batch, seq), jnp.int32, sharding=bs)
    data = {
        "inputs": tok,
        "targets": tok,
        "segment_ids": tok,
        "positions": tok,
        "loss_mask": jax.ShapeDtypeStruct((batch, seq), jnp.float32, sharding=bs),
        "target_bytes": tok,
    }
    rep = NamedSharding(mesh, P())
    shard = lambda tree: jax.tree.map(lambda x: x.sharding, tree)  # noqa: E731
    jitted = jax.jit(
        step_fn,
        in_shardings=(shard(params), shard(opt), rep, rep, shard(data)),
        out_shardings=(shard(params), shard(opt), rep, rep),
        donate_argnums=(0, 1),
    )
    rng = jax.ShapeDtypeStruct((2,), jnp.uint32, sharding=rep)
    step = jax.ShapeDtypeStruct((), jnp.int32, sharding=rep)
    return jitted.lower(params, opt, rng, step, data).compile()


@contextlib.contextmanager
def unrolled_layers():
    """While active (tracing for the plan only), the layer scans are unrolled: XLA's
    cost_analysis counts a while loop's body once, whatever its trip count, so FLOPs and the
    collectives in the HLO are read from a compile in which every layer is its own code."""
    from c2.model import transformer

    rolled = transformer._unroll_layers
    transformer._unroll_layers = lambda: True
    try:
        yield
    finally:
        transformer._unroll_layers = rolled


def measure(cfg, config, mesh, batch: int, seq: int) -> Measured:
    """Two compiles of the step: the layer loops rolled, as on the GPU, for the memory (remat
    holds only there); unrolled for the FLOPs and collectives. Unrolled, XLA merges remat's
    recomputed forward with the forward, so those FLOPs leave out the recomputation (one
    forward per rematerialised layer)."""
    t0 = time.perf_counter()
    mem = compile_step(cfg, config, mesh, batch, seq).memory_analysis()
    with unrolled_layers():
        compiled = compile_step(cfg, config, mesh, batch, seq)
    dt = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return Measured(
        argument=int(mem.argument_size_in_bytes),
        output=int(mem.output_size_in_bytes),
        alias=int(mem.alias_size_in_bytes),
        temp=int(mem.temp_size_in_bytes),
        # A device-less GPU executable has no cost analysis (the CPU plan has the FLOPs).
        flops=float(cost.get("flops", 0.0)) if cost else float("nan"),
        collectives=collectives(compiled.as_text()),
        compile_s=dt,
    )


def reduced(cfg, n_dense: int, n_moe: int):
    """`cfg` with n_dense dense and n_moe MoE layers (at most what the model has)."""
    return cfg.replace(n_layers=n_dense + n_moe, first_k_dense=n_dense)


def plan(
    config,
    *,
    device_memory_gb: float = 141.0,
    mesh=None,
    paths: str | None = "gpu",
    grouped_gemm: str = "standin",
    compile_for: str = "cpu",
    log=print,
) -> dict:
    """The per-device plan of one training step of `config` (see the module docstring).

    `paths`: the backend whose code paths are traced (c2.quant.target): "gpu" (default) compiles
    the GPU's layout on the CPU devices (`ragged_dot` experts, bf16 MXFP8 operands; the padded
    expert exchange, since XLA:CPU cannot compile `ragged_all_to_all`); None keeps the CPU's.
    `grouped_gemm`: "standin" (default) compiles the expert grouped matmuls as
    `grouped_gemm_standin`'s ops, "xla" as XLA lowers them (on the CPU: dense [G, M, N]
    expansions).
    `compile_for`: "cpu" (simulated CPU devices), or a GPU of GPU_TARGETS ("h200", "b300"):
    XLA:GPU compiles the step device-less for that many such GPUs (`gpu_devices`), with the GPU's
    code paths and ops (`c2.quant.target.compiling_for`; `paths` is then ignored). Its memory
    analysis is the GPU's own; it has no cost analysis, so the FLOPs are None.
    """
    if grouped_gemm not in GROUPED_GEMM:
        raise ValueError(f"grouped_gemm={grouped_gemm!r}: expected one of {GROUPED_GEMM}")
    import jax

    from c2.quant import target
    from c2.train import lm

    stage, batch, seq = stage_shapes(config)
    n_dev = _mesh_size(stage)
    mesh_sizes, cfg = lm.validate(stage, n_dev, load_files=False)
    on_gpu = compile_for != "cpu"
    if mesh is None and on_gpu:
        from c2 import sharding

        mesh = sharding.make_mesh(**mesh_sizes, devices=gpu_devices(compile_for, n_dev))
    if mesh is None:
        if jax.device_count() < n_dev:
            raise RuntimeError(
                f"the mesh needs {n_dev} devices, JAX has {jax.device_count()}: run "
                "`python -m c2.bench.plan` (it sets the simulated device count before JAX starts)"
            )
        mesh = lm.make_mesh(mesh_sizes) if jax.device_count() == n_dev else None
        if mesh is None:
            from c2 import sharding

            mesh = sharding.make_mesh(**mesh_sizes, devices=jax.devices()[:n_dev])
    n_dense, n_moe = cfg.first_k_dense, cfg.n_moe_layers
    # Each layer group is measured at >= 2 layers when the model has that many: XLA simplifies a
    # one-trip layer loop away, and the straight-line code then loses remat (see module doc).
    base_d, base_m = min(n_dense, 2), min(n_moe, 2)
    log(
        f"config {stage.name}: mesh {mesh_sizes}, batch {batch} x {seq} tokens, "
        f"{n_dense} dense + {n_moe} MoE layers, mtp_depth {cfg.mtp_depth}, remat {cfg.remat}, "
        f"quant {cfg.quant}, attention {getattr(cfg, 'attention_impl', 'xla')}, grouped GEMM "
        f"{grouped_gemm}, loss_chunk_tokens {stage.train.loss_chunk_tokens}, micro_batches "
        f"{stage.train.micro_batches}, compiled for {compile_for}"
    )
    runs = {}
    variants = [(base_d, base_m)]
    if n_moe > base_m:
        variants.append((base_d, base_m + 1))
    if n_dense > base_d:
        variants.append((base_d + 1, base_m))
    for nd, nm in variants:
        on_target = target.compiling_for("gpu") if on_gpu else target.as_backend(paths)
        with on_target, _grouped_gemm(grouped_gemm):
            m = measure(reduced(cfg, nd, nm), stage, mesh, batch, seq)
        runs[(nd, nm)] = m
        log(
            f"  compiled {nd} dense + {nm} MoE in {m.compile_s:.0f}s: args {m.argument / 1e9:.2f} "
            f"GB, temp {m.temp / 1e9:.2f} GB, {m.flops:.3e} FLOPs"
        )
    base = runs[(base_d, base_m)]
    zero = {
        "temp": 0,
        "flops": 0.0,
        "collectives": {k: {"count": 0, "bytes": 0} for k in COLLECTIVES},
    }
    d_moe = runs[(base_d, base_m + 1)].minus(base) if n_moe > base_m else zero
    d_dense = runs[(base_d + 1, base_m)].minus(base) if n_dense > base_d else zero
    k_moe, k_dense = n_moe - base_m, n_dense - base_d

    def scaled(key):
        return getattr(base, key) + k_moe * d_moe[key] + k_dense * d_dense[key]

    temp, flops = scaled("temp"), scaled("flops")
    colls = {
        k: {
            f: max(
                base.collectives[k][f]
                + k_moe * d_moe["collectives"][k][f]
                + k_dense * d_dense["collectives"][k][f],
                0,
            )
            for f in ("count", "bytes")
        }
        for k in COLLECTIVES
    }
    params, opt, _, _ = abstract_state(cfg, stage, mesh)
    param_bytes, opt_bytes = _tree_bytes(params), _tree_bytes(opt)
    rparams, ropt, _, _ = abstract_state(reduced(cfg, base_d, base_m), stage, mesh)
    batch_bytes = base.argument - _tree_bytes(rparams) - _tree_bytes(ropt)
    # What remat keeps across layers: each layer's temp increment, times the layers.
    activations = max(
        (n_moe * d_moe["temp"] if n_moe > base_m else 0)
        + (n_dense * d_dense["temp"] if n_dense > base_d else 0),
        0,
    )
    working = temp - activations
    # Outputs alias the donated params/optimiser state; whatever is not aliased is extra.
    unaliased_out = max(base.output - base.alias, 0)
    total = param_bytes + opt_bytes + batch_bytes + unaliased_out + temp
    limit = device_memory_gb * 1e9
    rows = [
        ("parameters", param_bytes),
        ("optimiser state", opt_bytes),
        ("batch", batch_bytes),
        ("activations kept (per-layer increment x layers)", activations),
        ("working set (rest of the temporaries)", working),
        ("outputs not aliased", unaliased_out),
        ("total per device", total),
    ]
    log(f"\nper-device plan ({n_dev} devices, {n_dense} dense + {n_moe} MoE layers):")
    for name, b in rows:
        log(f"  {name:<50} {b / 1e9:10.2f} GB")
    log(f"  per-MoE-layer temp increment {d_moe['temp'] / 1e9:.3f} GB, FLOPs {d_moe['flops']:.3e}")
    tokens = batch * seq / n_dev
    log(f"  FLOPs per device per step {flops:.3e} ({flops / tokens:.3e} per token on the device)")
    log("  collectives per step (count, result GB):")
    for k, v in colls.items():
        log(f"    {k:<20} {v['count']:6d} {v['bytes'] / 1e9:10.2f}")
    fits = total <= limit
    log(f"  fits {device_memory_gb:g} GB: {fits} ({total / limit:.0%} of it)")
    return {
        "config": stage.name,
        "devices": n_dev,
        "mesh": mesh_sizes,
        "batch": batch,
        "seq_len": seq,
        "remat": cfg.remat,
        "attention_impl": getattr(cfg, "attention_impl", "xla"),
        "paths": "gpu" if on_gpu else (paths or "native"),
        "compile_for": compile_for,
        "grouped_gemm": grouped_gemm,
        "loss_chunk_tokens": int(stage.train.loss_chunk_tokens),
        "micro_batches": int(stage.train.micro_batches),
        "param_bytes": param_bytes,
        "optimizer_bytes": opt_bytes,
        "batch_bytes": batch_bytes,
        "activation_bytes": activations,
        "temp_bytes": temp,
        "working_bytes": working,
        "per_device_bytes": total,
        "device_memory_gb": device_memory_gb,
        "fits": fits,
        "flops_per_device": _finite(flops),
        "moe_layer_temp_bytes": d_moe["temp"],
        "moe_layer_flops": _finite(d_moe["flops"]),
        "collectives": colls,
        "compile_s": sum(m.compile_s for m in runs.values()),
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _ensure_devices(n: int) -> None:
    """Simulated CPU devices for the mesh: XLA reads the flag when the backend starts."""
    flags = os.environ.get("XLA_FLAGS", "")
    flag = f"--xla_force_host_platform_device_count={n}"
    if flag in flags:
        return
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", flags)
    os.environ["XLA_FLAGS"] = f"{flags} {flag}".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="experiment config file[:arg]")
    ap.add_argument(
        "--device_memory_gb",
        type=float,
        default=None,
        help="the budget `fits` is checked against (default: the --compile_for GPU's, else 141)",
    )
    ap.add_argument(
        "--compile_for",
        default="cpu",
        choices=("cpu", *GPU_TARGETS),
        help="compile on simulated CPU devices (default), or device-less for that many GPUs of "
        "this kind (needs the CUDA PJRT plugin: pip install 'jax[cuda12]', no GPU)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="model.overrides.FIELD=VALUE",
        help="override a model field for the plan, e.g. remat=false (repeatable)",
    )
    ap.add_argument(
        "--loss_chunk_tokens",
        type=int,
        default=None,
        help="override config.train.loss_chunk_tokens for the plan (0: whole logits)",
    )
    ap.add_argument(
        "--micro_batches",
        type=int,
        default=None,
        help="override config.train.micro_batches for the plan (gradient accumulation)",
    )
    ap.add_argument(
        "--paths",
        default="gpu",
        choices=("gpu", "native"),
        help="trace the GPU's code paths (default) or the CPU's own",
    )
    ap.add_argument(
        "--grouped_gemm",
        default="standin",
        choices=GROUPED_GEMM,
        help="expert grouped matmuls as the GPU-sized stand-in (default) or XLA:CPU's lowering",
    )
    args = ap.parse_args(argv)
    from c2.train.config import load_config

    path, _, arg = args.config.partition(":")
    config = load_config(path, arg or None)
    for item in args.set:
        key, _, value = item.partition("=")
        config.model.overrides[key] = _parse_value(value)
    if args.loss_chunk_tokens is not None:
        config.train.loss_chunk_tokens = args.loss_chunk_tokens
    if args.micro_batches is not None:
        config.train.micro_batches = args.micro_batches
    if args.compile_for == "cpu":
        _ensure_devices(_mesh_size(stage_shapes(config)[0]))
    memory_gb = args.device_memory_gb or GPU_TARGETS.get(args.compile_for, {}).get(
        "memory_gb", 141.0
    )
    paths = None if args.paths == "native" else args.paths
    result = plan(
        config,
        device_memory_gb=memory_gb,
        paths=paths,
        grouped_gemm=args.grouped_gemm,
        compile_for=args.compile_for,
    )
    print(json.dumps(result, sort_keys=True))
    sys.stdout.flush()
    return result


def _parse_value(v: str):
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v


if __name__ == "__main__":
    main()
