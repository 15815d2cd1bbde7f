"""The per-device memory plan of each stage of a config, as it runs, from XLA's own analyses.

    python -m c2.bench.plan --config=experiments/cpt_kimi_k2.py --compile_for h200
    python -m c2.bench.plan --config=experiments/rl_kimi_k2.py --compile_for h200
    python -m c2.bench.plan --config=experiments/cpt_tiny.py          (simulated CPU devices)

Every program a stage runs is lowered and compiled whole, every layer of the real model (the
layers are one scanned loop, so a whole-model compile costs about what one layer's does), for
the config's mesh, with abstract inputs only (`jax.ShapeDtypeStruct` with their shardings:
nothing is allocated), and read back with `memory_analysis()`; nothing is scaled or
extrapolated. The stages (plan_stages.py):
  - an LM stage (cpt, long_context, sft): the train step, its loss and micro-batches;
  - an RL stage: the trainer (the reference's and the policy's log-prob forwards and the RL
    update, the state they share counted once) and the rollout engine (its weights and KV cache
    at `rl.rollout.engine_slots` slots of max(`rl.seq_buckets`) tokens on `rl.rollout_mesh`); a
    local engine shares the trainer's devices, so its bytes are added to the trainer's;
  - a pipeline (a config with `stages`): each of its stages.
The JSON line printed last keeps `per_device_bytes` (the largest entry) and `fits` (every entry
fits), and has one entry per stage and engine under `stages`; `not_fitting` names those that
do not.

Where it compiles: `--compile_for cpu` (default) on simulated CPU devices
(`--xla_force_host_platform_device_count` set before JAX starts), tracing the GPU's code paths
(`paths="gpu"`: `ragged_dot` experts, bf16 MXFP8 operands; the padded expert exchange, since
XLA:CPU cannot compile `ragged_all_to_all`); its buffers are XLA:CPU's, an estimate of a GPU's.
`--compile_for h200` (or b300) compiles device-less with XLA:GPU for a topology of that many
GPUs (the CUDA PJRT plugin, the `gpu-compile` extra; no GPU): the GPU's own ops, buffer
assignment, scheduling and rematerialisation: the verdict for a cluster.

The expert grouped matmul: XLA:CPU lowers `ragged_dot` to a dense [G, M, N] product masked per
group, and XLA:GPU's is no grouped GEMM either (a 1.7 TB working set at Kimi-K2's layout), so by
default (`--grouped_gemm standin`) the plan compiles a stand-in with a GPU grouped GEMM's
buffers and FLOPs (plan_compile.grouped_gemm_standin: every operand and result shape and dtype
kept, no buffer larger than an operand or a result; the values are not the real op's;
`tests/bench/test_plan_standin.py`). Training never enters it.

FLOPs per device are analytic (`c2.model.flops_per_token`; XLA counts a loop's body once); the
collectives are those in the compiled program's text (a layer loop's body once).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys

# Compiling a step lives in plan_compile.py, each stage in plan_stages.py; names importable here.
from c2.bench.plan_compile import (  # noqa: F401
    COLLECTIVES,
    GPU_TARGETS,
    GROUPED_GEMM,
    _grouped_gemm,
    abstract_state,
    collectives,
    compile_step,
    gpu_devices,
    grouped_gemm_standin,
)


def _mesh_size(config) -> int:
    """The devices the config's mesh names; 0 where an axis is -1 (the devices left over)."""
    from c2.train.config import MESH_AXES

    sizes = [int(config.mesh[a]) for a in MESH_AXES]
    return math.prod(sizes) if min(sizes) > 0 else 0


def _is_rl(config) -> bool:
    return "rl" in config


def stage_shapes(config):
    """(stage config the LM trainer understands, global batch, sequence length): an RL
    config's trainer micro-batch (rows of its longest bucket)."""
    if _is_rl(config):
        from c2.rl.config import lm_part

        base = lm_part(config)
        return base, int(config.rl.micro_batch_size), int(max(config.rl.seq_buckets))
    return config, int(config.data.batch_size), int(config.data.seq_len)


def stage_configs(config) -> dict:
    """name -> stage config: a pipeline's stages in `stage_order` (c2.pipeline, which bench
    may not import), else the config itself."""
    if "stages" in config:
        return {name: config.stages[name] for name in config.stage_order}
    return {config.name: config}


def devices_needed(config) -> int:
    """The most devices any stage's mesh (or an RL stage's rollout mesh) names (0: a mesh
    that takes whatever devices there are)."""
    from c2 import sharding

    n = 0
    for stage in stage_configs(config).values():
        n = max(n, _mesh_size(stage_shapes(stage)[0]))
        if _is_rl(stage):
            n = max(n, math.prod(sharding.parse_mesh(stage.rl.rollout_mesh).values()))
    return n


def _stage_mesh(mesh_sizes: dict, compile_for: str):
    import jax

    from c2 import sharding

    n = math.prod(mesh_sizes.values())
    if compile_for != "cpu":
        return sharding.make_mesh(**mesh_sizes, devices=gpu_devices(compile_for, n))
    if jax.device_count() < n:
        raise RuntimeError(
            f"the mesh {mesh_sizes} needs {n} devices, JAX has {jax.device_count()}: run "
            "`python -m c2.bench.plan` (it sets the simulated device count before JAX starts)"
        )
    return sharding.make_mesh(**mesh_sizes, devices=jax.devices()[:n])


def plan_stage(name, config, *, device_memory_gb, compile_for, log=print) -> list[dict]:
    """The entries of one stage: an LM stage's train step; an RL stage's trainer and engine."""
    import jax

    from c2 import sharding
    from c2.bench import plan_stages
    from c2.train import lm
    from c2.train.config import sharding_rules

    base, batch, seq = stage_shapes(config)
    # An axis of size 0 takes the devices left: then the mesh spans every device JAX has.
    n_dev = _mesh_size(base) or jax.device_count()
    mesh_sizes, cfg = lm.validate(base, n_dev, load_files=False)
    mesh = _stage_mesh(mesh_sizes, compile_for)
    log(
        f"stage {name}: mesh {mesh_sizes}, {cfg.first_k_dense} dense + {cfg.n_moe_layers} MoE "
        f"layers, mtp_depth {cfg.mtp_depth}, remat {cfg.remat}, quant {cfg.quant}, "
        f"loss_chunk_tokens {base.train.loss_chunk_tokens}, compiled for {compile_for}"
    )
    if not _is_rl(config):
        log(f"  train step: batch {batch} x {seq} tokens, micro_batches {base.train.micro_batches}")
        return [plan_stages.plan_lm(name, cfg, base, mesh, batch, seq, device_memory_gb)]
    layout = sharding.Layout(mesh, sharding_rules(base))
    engine = plan_stages.plan_engine(f"{name}/engine", config, cfg, device_memory_gb)
    trainer = plan_stages.plan_rl_trainer(f"{name}/trainer", config, cfg, layout, device_memory_gb)
    if config.rl.rollout_backend == "local":
        # The local engine decodes in a background thread while the update runs, on the
        # trainer's devices: both are resident at once.
        parts = dict(
            trainer["bytes"], **{"rollout engine (same devices)": engine["per_device_bytes"]}
        )
        trainer = {
            **trainer,
            **plan_stages.entry(trainer["stage"], trainer["devices"], parts, device_memory_gb),
        }
    return [trainer, engine]


def plan(
    config,
    *,
    device_memory_gb: float = 141.0,
    paths: str | None = "gpu",
    grouped_gemm: str = "standin",
    compile_for: str = "cpu",
    log=print,
) -> dict:
    """The per-device plan of every stage of `config` (see the module docstring).

    `paths`: the backend whose code paths are traced on CPU devices (c2.quant.target): "gpu"
    (default) or None (the CPU's own). `grouped_gemm`: "standin" (default) or "xla".
    `compile_for`: "cpu" (simulated CPU devices), or a GPU of GPU_TARGETS ("h200", "b300"):
    XLA:GPU compiles device-less for that many such GPUs (`gpu_devices`; `paths` is ignored).
    """
    if grouped_gemm not in GROUPED_GEMM:
        raise ValueError(f"grouped_gemm={grouped_gemm!r}: expected one of {GROUPED_GEMM}")
    from c2.quant import target

    on_target = target.compiling_for("gpu") if compile_for != "cpu" else target.as_backend(paths)
    entries = []
    with on_target, _grouped_gemm(grouped_gemm):
        for name, stage in stage_configs(config).items():
            entries += plan_stage(
                name, stage, device_memory_gb=device_memory_gb, compile_for=compile_for, log=log
            )
    return summary(config.name, entries, device_memory_gb, log=log) | {
        "compile_for": compile_for,
        "paths": "gpu" if compile_for != "cpu" else (paths or "native"),
        "grouped_gemm": grouped_gemm,
    }


def summary(name: str, entries: list[dict], device_memory_gb: float, log=print) -> dict:
    """The plan's JSON from its entries, each judged against `device_memory_gb` per device."""
    from c2.bench.plan_stages import entry

    entries = [
        entry(e["stage"], e["devices"], e["bytes"], device_memory_gb)
        | {k: v for k, v in e.items() if k not in ("fits", "device_memory_gb")}
        for e in entries
    ]
    for e in entries:
        log(f"\n{e['stage']} ({e['devices']} devices):")
        for part, b in e["bytes"].items():
            log(f"  {part:<60} {b / 1e9:10.2f} GB")
        verdict = "fits" if e["fits"] else "DOES NOT FIT"
        log(
            f"  {'total per device':<60} {e['per_device_bytes'] / 1e9:10.2f} GB: {verdict} "
            f"{device_memory_gb:g} GB ({e['per_device_bytes'] / (device_memory_gb * 1e9):.0%})"
        )
    not_fitting = [e["stage"] for e in entries if not e["fits"]]
    if not_fitting:
        log(f"does not fit {device_memory_gb:g} GB per device: {', '.join(not_fitting)}")
    first = entries[0]
    return {
        "config": name,
        "device_memory_gb": device_memory_gb,
        "per_device_bytes": max(e["per_device_bytes"] for e in entries),
        "fits": not not_fitting,
        "not_fitting": not_fitting,
        "stages": {e["stage"]: e for e in entries},
        # The first stage's breakdown, as the plan reported it before it had stages.
        "devices": first["devices"],
        "param_bytes": first["bytes"]["parameters"],
        "optimizer_bytes": first["bytes"]["optimiser state"],
        "flops_per_device": _finite(first.get("flops_per_device", float("nan"))),
        "compile_s": sum(e.get("compile_s", 0.0) for e in entries),
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
        metavar="FIELD=VALUE",
        help="override a config field for the plan (repeatable): a dotted path sets that field "
        "(rl.single_forward=false, mesh.fsdp=16), a bare name a model override (remat=false)",
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
        _set_field(config, item)
    if args.loss_chunk_tokens is not None:
        config.train.loss_chunk_tokens = args.loss_chunk_tokens
    if args.micro_batches is not None:
        config.train.micro_batches = args.micro_batches
    if args.compile_for == "cpu" and devices_needed(config):
        _ensure_devices(devices_needed(config))
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


def _set_field(config, item: str) -> None:
    """`--set FIELD=VALUE`: a dotted FIELD is a path into the config (it must exist; a tuple's
    VALUE is comma-separated), a bare one a model override (`config.model.overrides`);
    `mesh.rules.AXIS` may name any logical axis (the config's rules are overrides)."""
    from c2.eval.ablate import set_field

    key, eq, value = item.partition("=")
    if not eq or not key:
        raise SystemExit(f"--set {item!r}: expected FIELD=VALUE")
    if "." not in key:
        config.model.overrides[key] = _parse_value(value)
        return
    new = [_parse_value(v) for v in value.split(",") if v] if "," in value else _parse_value(value)
    if key.startswith("mesh.rules.") and key.count(".") == 2:
        axis, rules = key.rpartition(".")[2], config.mesh.rules
        if axis in rules:  # a rule's type may change (one mesh axis <-> several)
            del rules[axis]
        rules[axis] = tuple(new) if isinstance(new, list) else new
        return
    try:
        set_field(config, key, new)
    except KeyError as e:
        raise SystemExit(f"--set {item!r}: {e.args[0]}") from None


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
