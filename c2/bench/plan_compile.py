"""Compiling a step for the plan (c2.bench.plan): the device-less GPU targets (`gpu_devices`), the
grouped-GEMM stand-in (why: plan.py's module docstring), the sharded abstract state, the LM
train step lowered from abstract inputs, and the collectives in a compiled program's text.
"""

from __future__ import annotations

import contextlib
import math
import re

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
    """grouped._ragged for bf16 experts: the stand-in with a custom VJP (dx, dw; none for sizes)."""
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
    doc): `c2.model.grouped._ragged` (bf16 experts) and, inside `mxfp8_ragged_dot`'s custom VJP,
    `c2.quant.mxfp8._ragged_f32` (forward and input gradient) and `_grouped_xt_dy` (weight
    gradient). The MXFP8 quantise/dequantise around them is kept as it is."""
    import jax.numpy as jnp

    from c2.model import grouped
    from c2.quant import mxfp8

    standin_bf16 = _make_standin_ragged()
    real_ragged = grouped._ragged

    def ragged(x, w, group_sizes, c):
        if c.quant == "mxfp8":
            return real_ragged(x, w, group_sizes, c)
        dtype = jnp.dtype(c.dtype)
        return standin_bf16(x.astype(dtype), w.astype(dtype), group_sizes)

    saved = (grouped._ragged, mxfp8._ragged_f32, mxfp8._grouped_xt_dy)
    grouped._ragged = ragged
    mxfp8._ragged_f32 = _standin_dot
    mxfp8._grouped_xt_dy = _standin_xt_dy
    try:
        yield
    finally:
        grouped._ragged, mxfp8._ragged_f32, mxfp8._grouped_xt_dy = saved


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """Count and result bytes of each collective in compiled HLO text (async pairs once)."""
    out = {k: {"count": 0, "bytes": 0} for k in COLLECTIVES}
    for shape, op in _COLLECTIVE_RE.findall(hlo_text):
        out[op]["count"] += 1
        out[op]["bytes"] += _shape_bytes(re.sub(r"/\*[^*]*\*/", "", shape))
    return out


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
