"""Training throughput (forward + backward) of c2 vs transformers (PyTorch) on the same model.

    python -m c2.bench.model_throughput [--preset tiny_kimi_k2] [--batch 8] [--seq 256]

Both sides run identical weights (c2 params exported with c2.model.hf), the same batch, float32 on
the CPU, next-token cross-entropy, and time a full step (loss, backward). MFU = model FLOPs per
token (c2.model.flops_per_token) x tokens/s over the machine's matmul peak, measured here for
both frameworks (the larger is used). Prints a Markdown table and writes JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from c2 import model
from c2.bench.peak import host_matmul_peak_flops


def _timed(fn, steps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def c2_step_time(cfg, params, tokens, steps: int, backward: bool = True) -> float:
    def loss(p, toks):
        logits, aux = model.forward(p, toks[:, :-1], cfg)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, toks[:, 1:, None], -1))

    f = jax.jit(jax.value_and_grad(loss) if backward else loss)
    toks = jnp.asarray(tokens)
    return _timed(lambda: jax.block_until_ready(f(params, toks)), steps)


def torch_step_time(cfg, params, tokens, steps: int, threads: int) -> tuple[float, str]:
    import torch
    from transformers import AutoModelForCausalLM

    from c2.model.hf import export_hf_checkpoint

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as d:
        export_hf_checkpoint(params, cfg, d)
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    m.train()
    toks = torch.as_tensor(np.asarray(tokens), dtype=torch.long)

    def step():
        out = m(input_ids=toks[:, :-1], labels=None)
        logp = torch.log_softmax(out.logits, -1)
        loss = -logp.gather(-1, toks[:, 1:, None]).mean()
        loss.backward()
        m.zero_grad(set_to_none=True)

    impl = getattr(m.config, "_experts_implementation", None) or "default"
    return _timed(step, steps), f"transformers {m.config.model_type}, experts={impl}"


def torch_peak_flops(threads: int, n: int = 1024) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.ones(n, n), torch.ones(n, n)
    return 2 * n**3 / _timed(lambda: a @ b, 5)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="tiny_kimi_k2")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (= cores)")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args(argv)

    # MTP is a c2 addition the HF model does not run: off on both sides.
    cfg = model.presets.get(args.preset, dtype="float32", mtp_depth=0)
    params = model.init_params(cfg, jax.random.key(0))
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq + 1))
    n_tok = args.batch * args.seq
    flops_tok = model.flops_per_token(cfg, args.seq, include_mtp=False)
    peak = {"jax": host_matmul_peak_flops("float32")}
    rows = {}
    rows["c2 fwd+bwd (ragged experts)"] = c2_step_time(cfg, params, tokens, args.steps)
    rows["c2 fwd+bwd (dense experts)"] = c2_step_time(
        cfg.replace(moe_impl="dense"), params, tokens, args.steps
    )
    rows["c2 forward only"] = c2_step_time(cfg, params, tokens, args.steps, backward=False)
    torch_desc = None
    if not args.skip_torch:
        peak["torch"] = torch_peak_flops(args.threads)
        rows["transformers fwd+bwd"], torch_desc = torch_step_time(
            cfg, params, tokens, args.steps, args.threads
        )
    machine_peak = max(peak.values())
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "backend": jax.default_backend(),
        "preset": args.preset,
        "batch": args.batch,
        "seq": args.seq,
        "flops_per_token": flops_tok,
        "peak_flops": peak,
        "torch": torch_desc,
        "rows": {},
    }
    print(
        f"{args.preset} batch={args.batch} seq={args.seq} float32; matmul peak "
        + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peak.items())
    )
    print("| run | step (ms) | tokens/s | MFU |\n|---|---|---|---|")
    for name, t in rows.items():
        fwd_only = "forward only" in name
        mfu = (flops_tok / (3 if fwd_only else 1)) * n_tok / t / machine_peak
        result["rows"][name] = {"step_s": t, "tokens_per_s": n_tok / t, "mfu": mfu}
        print(f"| {name} | {t * 1e3:.1f} | {n_tok / t:,.0f} | {mfu:.1%} |")
    if "transformers fwd+bwd" in rows:
        ratio = rows["transformers fwd+bwd"] / rows["c2 fwd+bwd (ragged experts)"]
        result["c2_over_torch"] = ratio
        print(f"c2 / transformers (fwd+bwd tokens/s): {ratio:.2f}x   [{torch_desc}]")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
