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

Compiling and measuring one step (the GPU targets, the stand-in, the two compiles): plan_compile.py;
here, the layer scaling, the per-device report and the CLI.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

# Compiling and measuring one step lives in plan_compile.py; its names stay importable from here.
from c2.bench.plan_compile import (  # noqa: F401
    COLLECTIVES,
    GPU_TARGETS,
    GROUPED_GEMM,
    Measured,
    _grouped_gemm,
    _tree_bytes,
    abstract_state,
    collectives,
    compile_step,
    gpu_devices,
    grouped_gemm_standin,
    measure,
    reduced,
    unrolled_layers,
)


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
