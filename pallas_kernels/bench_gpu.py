"""GPU check of the Pallas kernels: correctness against the references first, then speed.

    python pallas_kernels/bench_gpu.py --out DIR        # from the repository root, a few minutes

1. Correctness on the device: the MXFP8 quantise kernel (bitwise vs `c2.quant.mxfp8.quantize`),
   the block-scaled matmul (vs dequantise-then-dot, and vs `jax.nn.scaled_matmul` where it runs),
   the grouped (expert) matmuls gmm/tgmm vs their references, the MXFP8 training ops (dense and
   grouped) with impl="pallas" vs impl="xla" (forward and both gradients), router replay forward
   (exact integers, gates) and backward (vs the jnp reference's autodiff). The kernels stand
   alone: the tiny model with them switched on is checked by `python -m c2.bench.kernels_gpu`,
   which runs this script with that check added.
2. Speed: TFLOP/s of the MXFP8 Pallas matmul (a few tile configs, best kept) vs XLA bf16 `jnp.dot`
   vs `jax.nn.scaled_matmul` at M=N=K in --sizes (quantisation timed separately); the expert
   GEMM at a Kimi-K2 shape per device (--experts) as bf16 `lax.ragged_dot` vs the grouped MXFP8
   kernel, forward alone and forward + both gradients; and GB/s of router replay vs its jnp
   reference at 64k tokens x 256 experts x top-8, next to the measured copy bandwidth.
   Aims on an H200: MXFP8 >= 1.2x bf16 at 8192^3; router replay >= half of copy.

Every section is guarded: a failure (API drift, a kernel that does not compile) is recorded with its
traceback in the JSON and the script goes on. Writes DIR/bench_gpu.json and prints a table.
On a CPU it runs the same code in Pallas interpret mode: `--smoke` (tiny shapes) checks the script.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from c2.quant import mxfp8 as mx  # noqa: E402
from pallas_kernels import mxfp8 as pk  # noqa: E402
from pallas_kernels import mxfp8_grouped as pg  # noqa: E402
from pallas_kernels import router_replay as rr  # noqa: E402

# Dense peaks (TFLOP/s) used only to report a fraction of peak; SXM parts.
PEAKS = {"H200": {"fp8": 1979.0, "bf16": 989.0}, "H100": {"fp8": 1979.0, "bf16": 989.0}}
MATMUL_CONFIGS = [  # (block_m, block_n, block_k, num_warps, num_stages)
    (128, 128, 128, 8, 3),
    (128, 256, 128, 8, 3),
    (256, 128, 128, 8, 3),
    (128, 128, 64, 4, 4),
]


def timed(fn, *args, iters: int) -> float:
    """Seconds per call: `iters` calls queued back to back, best of 3 rounds (after a warm-up);
    one round at `iters` 1 (the CPU smoke run, whose times are not looked at)."""
    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(3 if iters > 1 else 1):
        t0 = time.perf_counter()
        out = [fn(*args) for _ in range(iters)]
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / iters)
        del out
    return best


class Report:
    def __init__(self):
        self.data = {
            "correctness": {},
            "matmul": [],
            "grouped": {},
            "router_replay": {},
            "errors": [],
            "section_s": {},
        }

    @contextlib.contextmanager
    def guard(self, section: str):
        """Runs a section: its wall time goes in `section_s`; an exception is recorded in
        `errors` and the script goes on to the next section."""
        t0 = time.perf_counter()
        try:
            yield
        except Exception as exc:
            text = "".join(traceback.format_exception(exc))
            self.data["errors"].append({"section": section, "error": text[-4000:]})
            print(f"[{section}] FAILED: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        finally:
            self.data["section_s"][section] = round(time.perf_counter() - t0, 2)

    def check(self, name: str, ok: bool, **details):
        self.data["correctness"][name] = {"ok": bool(ok), **details}
        print(f"  {'ok  ' if ok else 'FAIL'} {name} {details}", flush=True)


def max_rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def gates_grad(route_fn, logits, idx, weights, kw):
    """d sum(gates * weights) / d logits, with idx traced (bad slots dropped, not rejected)."""
    loss = lambda l, i: jnp.sum(route_fn(l, i, **kw).gates_TK * weights)  # noqa: E731
    return jax.jit(jax.grad(loss))(logits, idx)


def check_kernels(report: Report, key, shrink: int = 1, extra_checks=()):
    """Every kernel against its reference; `shrink` divides the shapes (a CPU smoke run).
    `extra_checks`: callables (report, key, shrink) run after them (c2/bench/kernels_gpu.py adds
    the model with the kernels on; the kernels themselves know no model)."""
    print("correctness on", jax.devices()[0].device_kind, flush=True)
    d = lambda n: max(17, n // shrink)  # noqa: E731  (odd sizes stay odd: ragged tiles)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    x = jax.random.normal(k1, (d(1000), d(776)), jnp.float32) * jnp.exp(
        jax.random.uniform(k2, (d(1000), 1), minval=-10, maxval=10)
    )
    x = x.at[:64, :64].set(0.0).at[100, 5].set(448.0).at[101, 9].set(464.0)
    for bs in (32, 16):
        with report.guard(f"quantize bs={bs}"):
            got = jax.jit(functools.partial(pk.quantize, block_size=bs))(x)
            want = pk.quantize_reference(x, bs)
            same = all(
                np.array_equal(np.asarray(g).view(np.uint8), np.asarray(w).view(np.uint8))
                for g, w in zip(got, want)
            )
            report.check(f"quantize_bs{bs}_bitwise", same)
        with report.guard(f"matmul_nt bs={bs}"):
            qa, sa = mx.quantize(x[: d(520)], bs, axis=1)
            qb, sb = mx.quantize(jax.random.normal(k3, (d(300), x.shape[1])) * 0.01, bs, axis=1)
            got = jax.jit(functools.partial(pk.matmul_nt, block_size=bs))(qa, sa, qb, sb)
            err = max_rel_err(got, pk.matmul_nt_reference(qa, sa, qb, sb, bs))
            # FP8 tensor cores sum each 32-long product in reduced precision (~2^-14).
            report.check(f"matmul_nt_bs{bs}", err < 1e-3, max_rel_err=err)

    with report.guard("scaled_matmul cross-check"):
        a = jax.random.normal(k1, (d(512), d(1024)), jnp.float32)
        b = jax.random.normal(k2, (d(256), d(1024)), jnp.float32)
        qa, sa = mx.quantize(a, 32, axis=1)
        qb, sb = mx.quantize(b, 32, axis=1)
        ours = jax.jit(pk.matmul_nt)(qa, sa, qb, sb)
        theirs = jax.jit(jax.nn.scaled_matmul)(qa[None], qb[None], sa[None], sb[None])[0]
        err = max_rel_err(ours, theirs)
        report.check("matmul_nt_vs_jax_nn_scaled_matmul", err < 1e-3, max_rel_err=err)

    with report.guard("mxfp8_dot pallas vs xla"):
        xd = jax.random.normal(k3, (d(300), d(520)), jnp.bfloat16)
        wd = (jax.random.normal(k4, (d(520), d(200))) * 0.05).astype(jnp.bfloat16)
        dy = jax.random.normal(k1, (d(300), d(200)), jnp.bfloat16)

        def run(impl):
            def f(x, w, dy):
                y, vjp = jax.vjp(lambda x, w: mx.mxfp8_dot(x, w, impl=impl), x, w)
                return (y, *vjp(dy))

            return jax.jit(f)(xd, wd, dy)

        errs = [max_rel_err(g, w) for g, w in zip(run("pallas"), run("xla"))]
        report.check("mxfp8_dot_pallas_vs_xla_y_dx_dw", max(errs) < 1e-2, max_rel_errs=errs)

    check_grouped(report, k2, d)
    for score_func in ("sigmoid", "softmax"):
        with report.guard(f"router_replay {score_func}"):
            t, e, k = d(3000), max(16, 256 // shrink), max(4, 8 // shrink)
            logits = jax.random.normal(k2, (t, e), jnp.float32)
            idx = rr.live_topk(logits, k, score_func=score_func)
            idx = idx.at[7, 3].set(e + 3)  # a dropped slot (inside jit)
            kw = dict(score_func=score_func, norm_topk_prob=True, routed_scaling_factor=2.5)
            got = jax.jit(functools.partial(rr.router_replay, **kw))(logits, idx)
            want = jax.jit(functools.partial(rr.router_replay_reference, **kw))(logits, idx)
            ints = all(
                np.array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f)))
                for f in ("counts_E", "offsets_E", "sort_idx", "unsort_idx")
            )
            gate_err = max_rel_err(got.gates_TK, want.gates_TK)
            weights = jnp.cos(jnp.arange(t * k, dtype=jnp.float32)).reshape(t, k)

            grad_err = max_rel_err(
                gates_grad(rr.router_replay, logits, idx, weights, kw),
                gates_grad(rr.router_replay_reference, logits, idx, weights, kw),
            )
            ok = ints and gate_err < 1e-5 and grad_err < 1e-4
            report.check(
                f"router_replay_{score_func}",
                ok,
                ints_equal=ints,
                gate_err=gate_err,
                grad_err=grad_err,
            )

    for extra in extra_checks:
        extra(report, k2, shrink)


def tile_layout(sizes, tile_m: int) -> tuple[jax.Array, np.ndarray]:
    """tile_group [T] and the padded-layout row of each sorted row, for per-group row counts."""
    sizes = np.asarray(sizes)
    tiles = -(-sizes // tile_m)
    starts = np.concatenate([[0], np.cumsum(tiles * tile_m)[:-1]])
    rows = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, sizes)])
    return jnp.asarray(np.repeat(np.arange(len(sizes)), tiles), jnp.int32), rows


def vjp_all(f, x, w, dy):
    y, back = jax.vjp(f, x, w)
    return (y, *back(dy))


def check_grouped(report: Report, key, d):
    k1, k2, k3 = jax.random.split(key, 3)
    sizes, tile_m, k, n = [d(300), 0, d(517), d(64), 1], 128, d(776), d(520)
    tg, rows = tile_layout(sizes, tile_m)
    for bs in (32, 16):
        with report.guard(f"gmm/tgmm bs={bs}"):
            a = jax.random.normal(k1, (len(tg) * tile_m, k), jnp.float32)
            b = jax.random.normal(k2, (len(sizes), n, k), jnp.float32) * 0.02
            qa, sa = mx.quantize(a, bs, axis=1)
            qb, sb = mx.quantize(b, bs, axis=2)
            got = jax.jit(functools.partial(pg.gmm_nt, block_size=bs))(qa, sa, qb, sb, tg)
            err_g = max_rel_err(got, pg.gmm_nt_reference(qa, sa, qb, sb, tg, bs))
            dy = jax.random.normal(k3, (n, len(tg) * tile_m), jnp.float32)
            qa, sa = mx.quantize(a.T, bs, axis=1)
            qd, sd = mx.quantize(dy, bs, axis=1)
            run = jax.jit(functools.partial(pg.tgmm_nt, num_groups=len(sizes), block_size=bs))
            got = run(qa, sa, qd, sd, tg)
            err_t = max_rel_err(got, pg.tgmm_nt_reference(qa, sa, qd, sd, tg, len(sizes), bs))
            report.check(f"gmm_tgmm_bs{bs}", max(err_g, err_t) < 1e-3, errs=[err_g, err_t])
    with report.guard("mxfp8_tiled_grouped_dot pallas vs xla"):
        x = jax.random.normal(k1, (len(tg), tile_m, k), jnp.bfloat16)
        w = (jax.random.normal(k2, (len(sizes), k, n)) * 0.05).astype(jnp.bfloat16)
        dy = jax.random.normal(k3, (len(tg), tile_m, n), jnp.bfloat16)

        def run(impl):
            f = lambda x, w: mx.mxfp8_tiled_grouped_dot(x, w, tg, impl=impl)  # noqa: E731
            return jax.jit(functools.partial(vjp_all, f))(x, w, dy)

        errs = [max_rel_err(g, w) for g, w in zip(run("pallas"), run("xla"))]
        report.check("mxfp8_tiled_grouped_dot_pallas_vs_xla", max(errs) < 1e-2, errs=errs)


def bench_grouped(report: Report, experts: int, rows: int, k: int, n: int, iters: int, key):
    """The expert GEMM per device: `rows` routed rows over `experts` local experts (balanced)."""
    out = report.data["grouped"]
    sizes = np.full(experts, rows // experts)
    sizes[: rows % experts] += 1
    tg, idx = tile_layout(sizes, 128)
    out.update(experts=experts, rows=rows, K=k, N=n, padded_rows=len(tg) * 128)
    flops = 2.0 * rows * k * n
    k1, k2, k3 = jax.random.split(key, 3)
    x = jax.random.normal(k1, (rows, k), jnp.bfloat16)
    w = (jax.random.normal(k2, (experts, k, n)) * 0.02).astype(jnp.bfloat16)
    dy = jax.random.normal(k3, (rows, n), jnp.bfloat16)
    x_t = jnp.zeros((len(tg) * 128, k), x.dtype).at[idx].set(x).reshape(len(tg), 128, k)
    dy_t = jnp.zeros((len(tg) * 128, n), x.dtype).at[idx].set(dy).reshape(len(tg), 128, n)
    gs = jnp.asarray(sizes, jnp.int32)
    ragged = lambda x, w: jax.lax.ragged_dot(  # noqa: E731
        x, w, gs, preferred_element_type=jnp.float32
    ).astype(x.dtype)
    tiled = lambda x, w: mx.mxfp8_tiled_grouped_dot(x, w, tg, impl="pallas")  # noqa: E731
    for name, f, xs, dys in (
        ("bf16_ragged_dot", ragged, x, dy),
        ("mxfp8_pallas", tiled, x_t, dy_t),
    ):
        with report.guard(f"grouped {name}"):
            out[f"{name}_fwd_tflops"] = flops / timed(jax.jit(f), xs, w, iters=iters) / 1e12
            train = jax.jit(functools.partial(vjp_all, f))
            out[f"{name}_fwd_bwd_tflops"] = 3 * flops / timed(train, xs, w, dys, iters=iters) / 1e12
    for kind in ("fwd", "fwd_bwd"):
        a, b = out.get(f"mxfp8_pallas_{kind}_tflops"), out.get(f"bf16_ragged_dot_{kind}_tflops")
        if a and b:
            out[f"mxfp8_over_bf16_{kind}"] = a / b
    print("  ", out, flush=True)


def bench_matmul(report: Report, sizes, iters: int, key):
    peaks = next((v for k, v in PEAKS.items() if k in jax.devices()[0].device_kind), None)
    for n in sizes:
        flops = 2.0 * n**3
        ka, kb = jax.random.split(jax.random.fold_in(key, n))
        a = jax.random.normal(ka, (n, n), jnp.bfloat16)
        b_t = jax.random.normal(kb, (n, n), jnp.bfloat16)  # [N, K]: both operands K-major
        row = {"M=N=K": n}
        with report.guard(f"bf16 dot {n}"):
            dot = jax.jit(lambda a, b: jnp.dot(a, b.T, preferred_element_type=jnp.bfloat16))
            row["bf16_tflops"] = flops / timed(dot, a, b_t, iters=iters) / 1e12
        with report.guard(f"quantize {n}"):
            quant = jax.jit(functools.partial(pk.quantize, rowwise=True, colwise=False))
            row["quantize_ms_per_operand"] = timed(quant, a, iters=iters) * 1e3
            quant_both = jax.jit(pk.quantize)
            row["quantize_row_and_col_ms"] = timed(quant_both, a, iters=iters) * 1e3
        qa, qb = pk.quantize_reference(a, rowwise=True, colwise=False), None
        with report.guard(f"mxfp8 matmul {n}"):
            qb = pk.quantize_reference(b_t, rowwise=True, colwise=False)
            best = None
            for bm, bn, bk, warps, stages in MATMUL_CONFIGS:
                with report.guard(f"mxfp8 matmul {n} config {(bm, bn, bk, warps, stages)}"):
                    mm = jax.jit(
                        functools.partial(
                            pk.matmul_nt,
                            out_dtype=jnp.bfloat16,
                            block_m=bm,
                            block_n=bn,
                            block_k=bk,
                            num_warps=warps,
                            num_stages=stages,
                        )
                    )
                    tflops = flops / timed(mm, qa.q_row, qa.s_row, qb.q_row, qb.s_row, iters=iters)
                    tflops /= 1e12
                    row.setdefault("mxfp8_configs", {})[str((bm, bn, bk, warps, stages))] = tflops
                    if best is None or tflops > best[0]:
                        best = (tflops, (bm, bn, bk, warps, stages))
            if best is not None:
                row["mxfp8_pallas_tflops"], row["mxfp8_best_config"] = best[0], list(best[1])
        with report.guard(f"jax.nn.scaled_matmul {n}"):
            if qb is None:
                qb = pk.quantize_reference(b_t, rowwise=True, colwise=False)
            sm = jax.jit(jax.nn.scaled_matmul)
            args = (qa.q_row[None], qb.q_row[None], qa.s_row[None], qb.s_row[None])
            row["scaled_matmul_tflops"] = flops / timed(sm, *args, iters=iters) / 1e12
        if "mxfp8_pallas_tflops" in row and "bf16_tflops" in row:
            row["mxfp8_over_bf16"] = row["mxfp8_pallas_tflops"] / row["bf16_tflops"]
        if peaks and "mxfp8_pallas_tflops" in row:
            row["mxfp8_fraction_of_fp8_peak"] = row["mxfp8_pallas_tflops"] / peaks["fp8"]
        report.data["matmul"].append(row)
        print("  ", {k: v for k, v in row.items() if k != "mxfp8_configs"}, flush=True)


def bench_router(report: Report, tokens: int, experts: int, top_k: int, iters: int, key):
    out = report.data["router_replay"]
    out.update(tokens=tokens, experts=experts, top_k=top_k)
    with report.guard("copy bandwidth"):
        buf = jnp.zeros((64 * 2**20,), jnp.uint32)  # 256 MiB, far beyond L2
        copy = jax.jit(lambda x: x + jnp.uint32(1))
        out["copy_gbps"] = 2 * buf.nbytes / timed(copy, buf, iters=iters) / 1e9
        del buf
    logits = jax.random.normal(key, (tokens, experts), jnp.float32)
    idx = rr.live_topk(logits, top_k, score_func="sigmoid")
    kw = dict(score_func="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5)
    pairs = tokens * top_k
    # Compulsory traffic: read logits and indices; write gates, sort_idx and unsort_idx.
    nbytes = logits.nbytes + idx.nbytes + pairs * 4 * 3
    out["bytes"] = nbytes
    for name, fn in (("pallas", rr.router_replay), ("reference", rr.router_replay_reference)):
        with report.guard(f"router_replay {name}"):
            run = jax.jit(functools.partial(fn, **kw))
            seconds = timed(run, logits, idx, iters=iters)
            out[f"{name}_ms"] = seconds * 1e3
            out[f"{name}_gbps"] = nbytes / seconds / 1e9
        with report.guard(f"router_replay {name} backward"):
            grad = jax.jit(jax.grad(lambda l, i, fn=fn: jnp.sum(fn(l, i, **kw).gates_TK)))
            out[f"{name}_bwd_ms"] = timed(grad, logits, idx, iters=iters) * 1e3
    if "pallas_gbps" in out and "copy_gbps" in out:
        out["pallas_fraction_of_copy"] = out["pallas_gbps"] / out["copy_gbps"]
    print("  ", out, flush=True)


def print_table(data):
    print("\nMXFP8 matmul (TFLOP/s)")
    header = ("M=N=K", "bf16 dot", "mxfp8", "ratio", "scaled_mm", "quant ms")
    print("".join(f"{h:>11}" for h in header))
    keys = ("bf16_tflops", "mxfp8_pallas_tflops", "mxfp8_over_bf16", "scaled_matmul_tflops")
    for r in data["matmul"]:
        cells = [str(r["M=N=K"])] + [f"{r[k]:.2f}" if k in r else "-" for k in keys]
        quant = r.get("quantize_ms_per_operand")
        cells.append("-" if quant is None else f"{quant:.3f}")
        print("".join(f"{c:>11}" for c in cells))
    rnd = lambda d: {k: round(v, 3) if isinstance(v, float) else v for k, v in d.items()}  # noqa: E731
    print("\nExpert GEMM (TFLOP/s on routed rows)", rnd(data["grouped"]))
    print("\nRouter replay", rnd(data["router_replay"]))
    bad = [k for k, v in data["correctness"].items() if not v["ok"]]
    print(f"\ncorrectness: {len(data['correctness']) - len(bad)} ok, failed: {bad or 'none'}")
    print(f"errors: {[e['section'] for e in data['errors']] or 'none'}")


def main(argv=None, extra_checks=()):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for bench_gpu.json")
    parser.add_argument("--sizes", default="4096,8192", help="M=N=K values, comma separated")
    parser.add_argument("--router", default="65536,256,8", help="tokens,experts,top_k")
    parser.add_argument(
        "--experts",
        default="48,32768,7168,2048",
        help="local experts,routed rows,K,N of the expert GEMM (Kimi-K2 at EP8: 384/8 experts, "
        "d_model 7168, expert width 2048)",
    )
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--skip-correctness", action="store_true")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny shapes everywhere, one iteration: runs the whole script on a CPU in interpret "
        "mode (what tests/pallas_kernels/test_bench_gpu.py does), numbers meaningless",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.router, args.experts, args.iters = "96", "300,16,4", "4,200,64,48", 1
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report()
    device = jax.devices()[0]
    report.data.update(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        device=device.device_kind,
        backend=jax.default_backend(),
        jax=jax.__version__,
        python=platform.python_version(),
        command=" ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
    )
    key = jax.random.key(0)
    t0 = time.perf_counter()
    if not args.skip_correctness:
        check_kernels(report, key, shrink=8 if args.smoke else 1, extra_checks=extra_checks)
    print("matmul", flush=True)
    bench_matmul(report, [int(s) for s in args.sizes.split(",")], args.iters, key)
    print("expert GEMM", flush=True)
    bench_grouped(report, *(int(v) for v in args.experts.split(",")), args.iters, key)
    print("router replay", flush=True)
    tokens, experts, top_k = (int(v) for v in args.router.split(","))
    bench_router(report, tokens, experts, top_k, args.iters, key)
    report.data["wall_s"] = time.perf_counter() - t0
    (out_dir / "bench_gpu.json").write_text(json.dumps(report.data, indent=2))
    print_table(report.data)
    print(f"wrote {out_dir / 'bench_gpu.json'}")
    return report.data


if __name__ == "__main__":
    main()
