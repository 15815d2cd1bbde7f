"""Training throughput (forward + backward) of c2 vs transformers (PyTorch) on the same model.

    python -m c2.bench.model_throughput [--preset tiny_kimi_k2] [--batch 8] [--seq 256]
        [--repeats 7] [--dtype float32] [--xla_defaults] [--require-quiet] [--out FILE.json]

Both sides run identical weights (c2 params exported with c2.model.hf), the same batch, on the
CPU, next-token cross-entropy, and time a full step (loss, backward) and a forward. The runs are
interleaved (c2.bench.fair: one warm-up call each, then `--repeats` rounds calling every run in
turn, a short pause before each call) and reported as medians with their min-max spread. The
load average before and after, and the cores other processes used during the run, are printed
and written to the JSON; a busy machine (load >= 0.5) gets a loud warning, or a refusal with
--require-quiet. MFU = model FLOPs per token (c2.model.flops_per_token; 3x the forward for
forward + backward) x tokens/s over the machine's matmul peak, measured here for both frameworks
(the larger is used). Prints a Markdown table and writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2 import model, xla_cpu
from c2.bench import fair
from c2.train.peak import host_matmul_peak_flops


def _loss(cfg):
    def loss(p, toks):
        logits, _ = model.forward(p, toks[:, :-1], cfg)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, toks[:, 1:, None], -1))

    return loss


def c2_step(cfg, params, tokens, backward: bool = True, xla_defaults: bool = False):
    """A call running one c2 step (loss and gradients, or the loss only) to completion, compiled
    as c2's training programs are (c2/xla_cpu.py) or, with `xla_defaults`, with XLA's defaults."""
    loss = _loss(cfg)
    options = {} if xla_defaults else xla_cpu.train_options()
    f = jax.jit(jax.value_and_grad(loss) if backward else loss, compiler_options=options)
    toks = jnp.asarray(tokens)
    return lambda: jax.block_until_ready(f(params, toks))


def torch_steps(cfg, params, tokens, threads: int):
    """(fwd+bwd call, forward call, description) of transformers on the exported weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from c2.model.hf import export_hf_checkpoint

    torch.set_num_threads(threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]
    with tempfile.TemporaryDirectory() as d:
        export_hf_checkpoint(params, cfg, d)
        m = AutoModelForCausalLM.from_pretrained(d, dtype=dtype)
    m.train()
    toks = torch.as_tensor(np.asarray(tokens), dtype=torch.long)

    def loss():
        out = m(input_ids=toks[:, :-1], labels=None)
        logp = torch.log_softmax(out.logits.float(), -1)
        return -logp.gather(-1, toks[:, 1:, None]).mean()

    def step():
        loss().backward()
        m.zero_grad(set_to_none=True)

    def forward():
        with torch.no_grad():
            return loss()

    impl = getattr(m.config, "_experts_implementation", None) or "default"
    return step, forward, f"transformers {m.config.model_type}, experts={impl}, {threads} threads"


def torch_peak_flops(threads: int, dtype: str = "float32", n: int = 1024) -> float:
    import torch

    torch.set_num_threads(threads)
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    a, b = torch.ones(n, n, dtype=dt), torch.ones(n, n, dtype=dt)
    timing, _ = fair.interleave({"mm": lambda: a @ b}, repeats=5, warmup=2)
    return 2 * n**3 / timing["mm"].min


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="tiny_kimi_k2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--repeats", "--steps", type=int, default=7, help="interleaved timed rounds")
    ap.add_argument("--pause", type=float, default=0.2, help="untimed seconds before each call")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (= cores)")
    ap.add_argument("--dense", action="store_true", help="also time c2's dense-expert path")
    ap.add_argument(
        "--xla_defaults",
        action="store_true",
        help="also time c2's step compiled with XLA's default options (c2/xla_cpu.py)",
    )
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument(
        "--require-quiet", action="store_true", help="refuse to run at load average >= 0.5"
    )
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    check = fair.load_check(require_quiet=args.require_quiet)
    # MTP is a c2 addition the HF model does not run: off on both sides.
    cfg = model.presets.get(args.preset, dtype=args.dtype, mtp_depth=0)
    params = model.init_params(cfg, jax.random.key(0))
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq + 1))
    n_tok = args.batch * args.seq
    flops_tok = model.flops_per_token(cfg, args.seq, include_mtp=False)
    peak = {"jax": host_matmul_peak_flops(args.dtype)}
    runs = {
        "c2 fwd+bwd": c2_step(cfg, params, tokens),
        "c2 forward only": c2_step(cfg, params, tokens, backward=False),
    }
    if args.xla_defaults:
        runs["c2 fwd+bwd, XLA defaults"] = c2_step(cfg, params, tokens, xla_defaults=True)
        runs["c2 forward only, XLA defaults"] = c2_step(
            cfg, params, tokens, backward=False, xla_defaults=True
        )
    if args.dense:
        runs["c2 fwd+bwd (dense experts)"] = c2_step(cfg.replace(moe_impl="dense"), params, tokens)
    torch_desc = None
    if not args.skip_torch:
        peak["torch"] = torch_peak_flops(args.threads, args.dtype)
        step, forward, torch_desc = torch_steps(cfg, params, tokens, args.threads)
        runs["transformers fwd+bwd"] = step
        runs["transformers forward only"] = forward
    timings, _ = fair.interleave(runs, args.repeats, pause=args.pause)
    check = fair.finish(check)
    machine_peak = max(peak.values())
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
        "preset": args.preset,
        "dtype": args.dtype,
        "batch": args.batch,
        "seq": args.seq,
        "repeats": args.repeats,
        "flops_per_token": flops_tok,
        "peak_flops": peak,
        "torch": torch_desc,
        **check.record(),
        "rows": {},
    }
    print(
        f"{args.preset} batch={args.batch} seq={args.seq} {args.dtype}; {args.repeats} "
        "interleaved rounds; matmul peak "
        + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peak.items())
    )
    print("| run | step, ms: median (min-max) | tokens/s | MFU |\n|---|---|---|---|")
    for name, t in timings.items():
        fwd_only = "forward only" in name
        mfu = (flops_tok / (3 if fwd_only else 1)) * n_tok / t.median / machine_peak
        result["rows"][name] = {
            "step_s": t.median,
            "tokens_per_s": n_tok / t.median,
            "mfu": mfu,
            **t.summary(),
        }
        print(f"| {name} | {t.spread()} | {n_tok / t.median:,.0f} | {mfu:.1%} |")
    med = {name: t.median for name, t in timings.items()}
    result["c2_backward_over_forward"] = med["c2 fwd+bwd"] / med["c2 forward only"]
    print(f"c2 fwd+bwd / forward time: {result['c2_backward_over_forward']:.2f}x")
    if "transformers fwd+bwd" in med:
        ratio = med["transformers fwd+bwd"] / med["c2 fwd+bwd"]
        fwd_ratio = med["transformers forward only"] / med["c2 forward only"]
        result["c2_over_torch"] = ratio
        result["c2_over_torch_forward"] = fwd_ratio
        print(
            f"c2 / transformers tokens/s: fwd+bwd {ratio:.2f}x, forward {fwd_ratio:.2f}x"
            f"   [{torch_desc}]"
        )
    if check.busy:
        print("(machine busy: see the warning above; not a valid comparison)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
