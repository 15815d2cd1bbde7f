"""Dense vs blockwise attention: forward + backward time on the CPU, and XLA's compiled memory.

    python -m c2.bench.attention_memory [--seqs 1024 4096] [--repeats 3] [--heads 4]
        [--qk-dim 48] [--v-dim 32] [--block 512] [--plan-256k] [--out FILE.json]

Times jit(grad) of sum(attention * r) for causal attention over one packed row (two documents),
float32, MLA-style head dims (tiny_kimi_k2's 48 q/k, 32 v by default), dense (`attend`: float32
scores [B, heads, T, S]) against blockwise (c2/model/flash.py), interleaved (c2.bench.fair) with
the load average recorded. For each it reports XLA's `compiled.memory_analysis()` temporaries
next to the size of one float32 score matrix, B * heads * T * S * 4 bytes.

`--plan-256k` also compiles (never runs) Kimi-K2's attention at the long-context layout of
experiments/long_context_kimi_k2.py: one 262,144-token row per data shard, 64 heads, q/k 192 and
v 128, bf16, ring attention over an 8-way context axis of simulated CPU devices, and prints the
per-device temporaries of the fwd + bwd (what the device plan counts for attention).
"""

from __future__ import annotations

import os

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    # The 256k plan needs a context axis of 8; harmless for the single-device timings.
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from c2 import sharding  # noqa: E402
from c2.bench import fair  # noqa: E402
from c2.model import attention, flash, ring  # noqa: E402

MiB = 2**20


def _fns(seg, scale, block):
    idx = jnp.broadcast_to(jnp.arange(seg.shape[1]), seg.shape)

    def dense(q, k, v):
        return attention.attend(q, k, v, attention.attention_mask(seg, seg, idx, idx), scale)

    def blockwise(q, k, v):
        return flash.flash_attention(q, k, v, seg, seg, idx, idx, scale, block, block)

    return {"dense": dense, "blockwise": blockwise}


def _fwd_bwd(f, r):
    return jax.jit(jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * r), argnums=(0, 1, 2)))


def measure(seq: int, heads: int, qk_dim: int, v_dim: int, block: int, repeats: int) -> dict:
    ks = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(ks[0], (1, seq, heads, qk_dim))
    k = jax.random.normal(ks[1], (1, seq, heads, qk_dim))
    v = jax.random.normal(ks[2], (1, seq, heads, v_dim))
    r = jax.random.normal(ks[3], (1, seq, heads, v_dim))
    seg = jnp.ones((1, seq), jnp.int32).at[:, seq // 3 :].set(2)
    out = {"seq": seq, "scores_bytes": heads * seq * seq * 4}
    runs = {}
    for name, f in _fns(seg, qk_dim**-0.5, block).items():
        g = _fwd_bwd(f, r)
        out[f"{name}_temp_bytes"] = g.lower(q, k, v).compile().memory_analysis().temp_size_in_bytes
        runs[name] = lambda g=g: jax.block_until_ready(g(q, k, v))
    timings, _ = fair.interleave(runs, repeats)
    for name, t in timings.items():
        out[f"{name}_s"] = t.summary()
    out["blockwise_over_dense_time"] = timings["blockwise"].median / timings["dense"].median
    return out


def plan_256k(block_q: int = 512, block_kv: int = 512, context: int = 8) -> dict:
    """Per-device compiled temporaries of Kimi-K2 attention fwd + bwd at 262,144 tokens."""
    T, N, d, dv = 262144, 64, 192, 128
    mesh = sharding.make_mesh(context=context, devices=jax.devices()[:context])
    spec = lambda *s: jax.ShapeDtypeStruct(s, jnp.bfloat16)  # noqa: E731
    seg = jnp.ones((1, T), jnp.int32)

    def loss(q, k, v):
        o = ring.context_attention(
            q, k, v, seg, scale=d**-0.5, mesh=mesh, block_q=block_q, block_kv=block_kv
        )
        return jnp.sum(o.astype(jnp.float32))

    g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    t = time.perf_counter()
    m = g.lower(spec(1, T, N, d), spec(1, T, N, d), spec(1, T, N, dv)).compile()
    m = m.memory_analysis()
    local = T // context
    return {
        "seq": T,
        "context": context,
        "heads": N,
        "block_q": block_q,
        "block_kv": block_kv,
        "temp_bytes_per_device": m.temp_size_in_bytes,
        "argument_bytes_per_device": m.argument_size_in_bytes,
        "output_bytes_per_device": m.output_size_in_bytes,
        "dense_scores_bytes_per_device": N * local * T * 4,
        "compile_s": time.perf_counter() - t,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--qk-dim", type=int, default=48)
    ap.add_argument("--v-dim", type=int, default=32)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--plan-256k", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    check = fair.load_check()
    rows = [
        measure(s, args.heads, args.qk_dim, args.v_dim, args.block, args.repeats) for s in args.seqs
    ]
    check = fair.finish(check)
    print(
        "| T | dense fwd+bwd ms | blockwise ms | ratio | dense temp MiB | blockwise MiB "
        "| scores MiB |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['seq']} | {r['dense_s']['median_s'] * 1e3:.0f} | "
            f"{r['blockwise_s']['median_s'] * 1e3:.0f} | {r['blockwise_over_dense_time']:.2f} | "
            f"{r['dense_temp_bytes'] / MiB:.1f} | {r['blockwise_temp_bytes'] / MiB:.1f} | "
            f"{r['scores_bytes'] / MiB:.1f} |"
        )
    result = {"date": time.strftime("%Y-%m-%d"), "rows": rows, **check.record()}
    if args.plan_256k:
        plan = plan_256k(args.block, args.block)
        result["plan_256k"] = plan
        print(
            f"Kimi-K2 attention at 256k, ring over context {plan['context']}: fwd+bwd temporaries "
            f"{plan['temp_bytes_per_device'] / 2**30:.2f} GiB per device (dense scores alone would "
            f"be {plan['dense_scores_bytes_per_device'] / 2**30:.0f} GiB)"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
