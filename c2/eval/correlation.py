"""CPT loss vs RL accuracy (the report's Figure 2, small): read runs, fit a line, plot.

Each run is a pipeline workdir (experiments/cpt_rl_correlation.py makes them: CPT at one compute
scale, then identical long-context, SFT, agent SFT and RL stages). x = held-out cross-entropy
after CPT, in bits per byte (`DIR/cpt/final_metrics.json` eval_bpb: per byte, so it compares
across tokenizers); y = the RL stage's final held-out pass@1 (`DIR/rl/final_metrics.json`).
`fit` is ordinary least squares with r^2; `write` saves OUT/correlation.json and
OUT/correlation.png.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def fit(x: Sequence[float], y: Sequence[float]) -> dict:
    """y ~ slope * x + intercept by least squares; r^2 = 1 - SS_res / SS_tot (None if y is
    constant)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) != len(y) or len(x) < 3:
        raise ValueError(f"fit: need >= 3 paired points, got {len(x)} x and {len(y)} y")
    slope, intercept = np.polyfit(x, y, 1)
    pred = slope * x + intercept
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    # r^2 is undefined when y does not vary (e.g. RL pass@1 0 at every scale): None.
    r2 = 1.0 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else None
    return {"slope": float(slope), "intercept": float(intercept), "r2": r2, "n": len(x)}


def read_point(run_dir: str | Path) -> dict:
    """(CPT compute, held-out CE, RL pass@1) of one pipeline workdir."""
    run_dir = Path(run_dir)
    cpt = json.loads((run_dir / "cpt" / "final_metrics.json").read_text())
    rl = json.loads((run_dir / "rl" / "final_metrics.json").read_text())
    final = rl["evaluations"][str(rl["steps"])]
    return {
        "run": str(run_dir),
        "cpt_steps": cpt["step"],
        "cpt_flops": cpt.get("cum_flops"),
        "heldout_ce_bpb": cpt["eval_bpb"],
        "rl_pass@1": final["pass@1"],
        "rl_pass@1_ci95": final["pass@1_ci95"],
        "rl_pass@1_start": rl["evaluations"].get("0", {}).get("pass@1"),
    }


def write(points: list[dict], out: str | Path) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    x = [p["heldout_ce_bpb"] for p in points]
    y = [p["rl_pass@1"] for p in points]
    line = fit(x, y)
    result = {"points": points, "fit": line}
    (out / "correlation.json").write_text(json.dumps(result, indent=2))
    fig, ax = plt.subplots(figsize=(5, 3.8))
    err = np.array([[p["rl_pass@1"] - p["rl_pass@1_ci95"][0] for p in points],
                    [p["rl_pass@1_ci95"][1] - p["rl_pass@1"] for p in points]])  # fmt: skip
    ax.errorbar(x, y, yerr=err, fmt="o", capsize=3, label="runs (95% interval over tasks)")
    xs = np.linspace(min(x), max(x), 50)
    ax.plot(
        xs,
        line["slope"] * xs + line["intercept"],
        "--",
        label="fit, r^2 = " + ("-" if line["r2"] is None else f"{line['r2']:.2f}"),
    )
    for p in points:
        ax.annotate(f"{p['cpt_steps']} steps", (p["heldout_ce_bpb"], p["rl_pass@1"]), fontsize=7)
    ax.set(xlabel="held-out CE after CPT (bits per byte)", ylabel="RL held-out pass@1")
    ax.set_title("CPT loss vs RL accuracy")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "correlation.png", dpi=110)
    plt.close(fig)
    return result
