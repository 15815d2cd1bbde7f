"""Proof that MXFP8 trains: the tiny model, bf16 vs MXFP8, same data, seed and schedule.

    python -m c2.bench.mxfp8_training --workdir runs/mxfp8 [--steps 300] [--block_size 32]

Runs experiments/cpt_tiny.py twice through the ordinary training loop (c2.train), once with bf16
matmuls and once with every dense projection and expert GEMM in MXFP8 (forward, input-gradient
and weight-gradient), then writes both loss curves to WORKDIR/mxfp8_vs_bf16.png and the final
losses (mean of the last 10% of steps) to WORKDIR/mxfp8_vs_bf16.json. Aim: within 1% relative.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

EXPERIMENT = Path(__file__).resolve().parents[2] / "experiments" / "cpt_tiny.py"


def run(quant: str, workdir: Path, steps: int, block_size: int, lr: float | None) -> list[dict]:
    from c2.train.config import load_config
    from c2.train.lm import build_task
    from c2.train.loop import train
    from c2.train.metrics import read_metrics

    config = load_config(EXPERIMENT)
    config.name = f"cpt_tiny_{quant}"
    config.model.dtype = "bfloat16"
    config.model.quant = quant
    config.model.overrides.mxfp8_block_size = block_size
    config.train.steps = steps
    if lr:
        config.optimizer.lr = lr
    config.train.checkpoint_every = steps
    config.train.eval_every = steps
    train(config, workdir, build_task(config))
    return read_metrics(workdir / "metrics.jsonl")


def final_loss(records: list[dict], frac: float = 0.1) -> float:
    losses = [r["loss"] for r in records if "loss" in r]
    return float(np.mean(losses[-max(1, int(len(losses) * frac)) :]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--block_size", type=int, default=32, choices=(16, 32))
    ap.add_argument(
        "--lr", type=float, default=None, help="peak learning rate (default: the config's)"
    )
    args = ap.parse_args(argv)
    root = Path(args.workdir)
    curves, seconds = {}, {}
    for quant in ("bf16", "mxfp8"):
        t = time.perf_counter()
        curves[quant] = run(quant, root / quant, args.steps, args.block_size, args.lr)
        seconds[quant] = time.perf_counter() - t
    final = {q: final_loss(r) for q, r in curves.items()}
    rel = abs(final["mxfp8"] - final["bf16"]) / final["bf16"]
    heldout = {
        q: [r["eval_bpb"] for r in recs if "eval_bpb" in r][-1:] for q, recs in curves.items()
    }
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "steps": args.steps,
        "block_size": args.block_size,
        "final_loss": final,
        "relative_difference": rel,
        "heldout_bits_per_byte": heldout,
        "wall_seconds": seconds,
    }
    (root / "mxfp8_vs_bf16.json").write_text(json.dumps(result, indent=2))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for q, recs in curves.items():
        pts = [(r["step"], r["loss"]) for r in recs if "loss" in r]
        ax.plot(*zip(*pts), label=f"{q} (final {final[q]:.4f})", lw=1)
    ax.set(
        xlabel="step",
        ylabel="train loss (nats/token)",
        yscale="log",
        title=f"tiny Kimi-K2, bf16 vs MXFP8 (block {args.block_size}): {rel:.2%} apart",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(root / "mxfp8_vs_bf16.png", dpi=120)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
