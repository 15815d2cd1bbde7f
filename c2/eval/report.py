"""The main job's report: DIR/report.md with tables of every number and PNG plots beside it."""

from __future__ import annotations

import datetime
import json
import math
import platform
from pathlib import Path

import jax

from c2.train import metrics as metrics_lib

REPORT_FILE = "report.md"


def _fmt(value, digits=3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e9:
            return f"{int(value):,}"
        if not math.isfinite(value):
            return str(value)
        if abs(value) >= 1e5:
            return f"{value:.3g}"
        return f"{value:.{digits}f}"
    return str(value)


def _plot_training(records: list[dict], stage_names, out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("loss", "train loss"), ("bpb", "train bits/byte"), ("mtp1_acceptance", "MTP accept")]
    keys = [(k, t) for k, t in keys if any(k in r for r in records)]
    if not keys:
        return None
    fig, axes = plt.subplots(1, len(keys), figsize=(4.6 * len(keys), 3.4), squeeze=False)
    for ax, (key, title) in zip(axes[0], keys):
        for name in stage_names:
            pts = [(r["step"], r[key]) for r in records if r.get("stage") == name and key in r]
            if pts:
                ax.plot(*zip(*pts), label=name)
            evals = [
                (r["step"], r["eval_bpb"])
                for r in records
                if r.get("stage") == name and r.get("eval_bpb") is not None
            ]
            if key == "bpb" and evals:
                ax.scatter(*zip(*evals), marker="x", color="k", zorder=3)
        ax.set_title(title)
        ax.set_xlabel("step (all stages)")
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    if any(k == "bpb" for k, _ in keys):
        axes[0][[k for k, _ in keys].index("bpb")].set_ylabel("x: held-out bits/byte")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _plot_eval(results: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = results["rows"]
    labels = [r["model"] for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(rows)), 3.8))
    w = 0.38
    short = [r["bpb_short"] for r in rows]
    long = [r["bpb_long"] for r in rows]
    ax.bar(x - w / 2, short, w, label=f"{results['short_seq_len']} tokens")
    ax.bar(x + w / 2, long, w, label=f"{results['long_seq_len']} tokens")
    for xi, (a, b) in enumerate(zip(short, long)):
        ax.text(xi - w / 2, a, f"{a:.2f}", ha="center", va="bottom", fontsize=8)
        ax.text(xi + w / 2, b, f"{b:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, labels, rotation=15, fontsize=8)
    ax.set_ylabel("held-out bits per byte")
    ax.set_title("Held-out bits per byte at the short and the extended length")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _stage_rows(stages: dict, workdir: Path) -> list[dict]:
    rows = []
    for name, stage in stages.items():
        records = metrics_lib.read_metrics(workdir / name / metrics_lib.METRICS_FILE)
        last = records[-1] if records else {}
        rows.append(
            {
                "stage": name,
                "kind": stage.data.kind,
                "steps": stage.train.steps,
                "seq_len": stage.data.seq_len,
                "batch": stage.data.batch_size,
                "yarn": stage.model.yarn.factor or None,
                "tokens": last.get("cum_tokens"),
                "flops": last.get("cum_flops"),
                "device_s": last.get("cum_device_seconds"),
                "loss": last.get("loss"),
                "eval_bpb": last.get("eval_bpb"),
                "tokens_per_s": last.get("tokens_per_s"),
                "mfu": last.get("mfu"),
            }
        )
    return rows


def findings(results: dict) -> list[str]:
    """The sentences the numbers support (computed, never written by hand)."""
    rows = {r["model"]: r for r in results["rows"]}
    order = [r["model"] for r in results["rows"]]
    base = rows[order[0]]
    lines = []
    after_first = rows[order[1]] if len(order) > 1 else None
    if after_first:
        lines.append(
            f"{order[1].capitalize()}: held-out bits per byte at {results['short_seq_len']} "
            f"tokens fell from {base['bpb_short']:.2f} ({order[0]}) to "
            f"{after_first['bpb_short']:.2f}."
        )
    yarn_rows = [m for m in order if rows[m]["yarn"]]
    no_yarn = [m for m in order[1:] if not rows[m]["yarn"]]
    if yarn_rows and no_yarn:
        before = rows[no_yarn[-1]]
        ext = next((m for m in yarn_rows if m.startswith("after")), yarn_rows[-1])
        lines.append(
            f"At the extended length ({results['long_seq_len']} tokens): {before['bpb_long']:.2f} "
            f"before extension ({no_yarn[-1]}), {rows[ext]['bpb_long']:.2f} {ext}; at "
            f"{results['short_seq_len']} tokens {before['bpb_short']:.2f} -> "
            f"{rows[ext]['bpb_short']:.2f}."
        )
    if "sft_bpb" in base:
        sft_rows = [m for m in order if m.startswith("after")]
        lines.append(
            "Held-out SFT response bits per byte: "
            + ", ".join(f"{m} {rows[m]['sft_bpb']:.2f}" for m in [order[0], *sft_rows])
            + "."
        )
    reads = [(m, rows[m]["reads_operation"]) for m in order if "reads_operation" in rows[m]]
    if reads:
        lines.append(
            "Reading its task (held-out operation right, chance 0.33): "
            + ", ".join(f"{m} {a:.2f}" for m, a in reads)
            + "."
        )
    acc = [(m, rows[m]["mtp1_acceptance"]) for m in order if rows[m].get("mtp1_acceptance")]
    if acc:
        lines.append(
            "MTP depth-1 acceptance (argmax agreement with the main head): "
            + ", ".join(f"{m} {a:.2f}" for m, a in acc)
            + "."
        )
    return lines


RL_PLOTS = ("rewards", "penalties", "heldout", "mismatch", "throughput", "episodes", "optim")


def _rl_section(stages: dict, workdir: Path) -> list[str]:
    """Held-out pass@1 and best-of-K through each RL stage, the gain's 95% interval, its plots."""
    out = []
    for name, stage in stages.items():
        if "rl" not in stage:
            continue
        path = workdir / name / "eval.jsonl"
        evals = [json.loads(x) for x in path.read_text().splitlines() if x] if path.exists() else []
        out += ["", f"## RL stage `{name}`", ""]
        if evals:
            k = evals[0]["k"]
            out += [
                f"Held-out tasks (templates never trained on): {evals[0]['tasks']} tasks x {k} "
                f"samples; 95% intervals over tasks.",
                "",
                f"| step | pass@1 | 95% interval | best-of-{k} | 95% interval |",
                "|---|---|---|---|---|",
            ]
            for e in evals:
                lo, hi = e["pass@1_ci95"]
                blo, bhi = e[f"best_of_{k}_ci95"]
                out.append(
                    f"| {e['step']} | {_fmt(e['pass@1'])} | [{_fmt(lo)}, {_fmt(hi)}] | "
                    f"{_fmt(e[f'best_of_{k}'])} | [{_fmt(blo)}, {_fmt(bhi)}] |"
                )
        final = workdir / name / "final_metrics.json"
        gain = json.loads(final.read_text()).get("gain") if final.exists() else None
        if gain:
            lo, hi = gain["pass@1_delta_ci95"]
            blo, bhi = gain["best_of_k_delta_ci95"]
            out += [
                "",
                f"Gain from the RL start (paired over {gain['tasks']} tasks): pass@1 "
                f"{gain['pass@1_delta']:+.3f} [{lo:+.3f}, {hi:+.3f}], best-of-K "
                f"{gain['best_of_k_delta']:+.3f} [{blo:+.3f}, {bhi:+.3f}].",
            ]
        out.append("")
        for plot in RL_PLOTS:
            if (workdir / name / f"{plot}.png").exists():
                out.append(f"![{name} {plot}]({name}/{plot}.png)")
    return out


def write_report(config, stages: dict, workdir: str | Path, results: dict, timings: dict) -> Path:
    """Writes DIR/report.md, DIR/training_curves.png and DIR/eval_bpb.png."""
    workdir = Path(workdir)
    records = metrics_lib.read_metrics(workdir / metrics_lib.METRICS_FILE)
    curves = _plot_training(records, list(stages), workdir / "training_curves.png")
    bars = _plot_eval(results, workdir / "eval_bpb.png")
    stage_rows = _stage_rows(stages, workdir)
    total_flops = sum(r["flops"] or 0.0 for r in stage_rows)
    total_tokens = sum(r["tokens"] or 0.0 for r in stage_rows)
    total_dev_s = sum(r["device_s"] or 0.0 for r in stage_rows)
    out = [
        f"# {config.name}: " + ", ".join(s.replace("_", " ") for s in stages) + ", evaluation",
        "",
        f"Written {datetime.datetime.now().isoformat(timespec='seconds')} on "
        f"{platform.node()} ({jax.device_count()} x {jax.devices()[0].device_kind}, "
        f"jax {jax.__version__}). Wall time of this invocation: "
        + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items())
        + f"; total {sum(timings.values()):.0f}s.",
        "",
        "## Findings",
        "",
        *[f"- {line}" for line in findings(results)],
        "",
        "## Stages",
        "",
        "| stage | data | steps | seq len | batch | YaRN | tokens | FLOPs | device-s | tokens/s "
        "| MFU | final loss | held-out bpb |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in stage_rows:
        out.append(
            f"| {r['stage']} | {r['kind']} | {r['steps']} | {r['seq_len']} | {r['batch']} | "
            f"{_fmt(r['yarn'], 1)} | {_fmt(r['tokens'])} | {_fmt(r['flops'])} | "
            f"{_fmt(r['device_s'], 0)} | {_fmt(r['tokens_per_s'], 0)} | {_fmt(r['mfu'], 4)} | "
            f"{_fmt(r['loss'])} | {_fmt(r['eval_bpb'])} |"
        )
    out += [
        f"| total | | | | | | {_fmt(total_tokens)} | {_fmt(total_flops)} | {_fmt(total_dev_s, 0)}"
        " | | | | |",
        "",
        "Each stage's held-out bpb is on its own data (pretraining text, or SFT responses).",
        "",
        "## Evaluation",
        "",
        f"Held-out split of the corpus, {int(results['short_tokens'])} target tokens at "
        f"{results['short_seq_len']} and {int(results['long_tokens'])} at "
        f"{results['long_seq_len']} tokens per sequence; SFT: held-out functions' responses.",
        "",
        f"| weights | YaRN | bpb @{results['short_seq_len']} | bpb @{results['long_seq_len']} | "
        "MTP acceptance | SFT response bpb | reads operation | reads constant | call head |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        out.append(
            f"| {r['model']} | {'yes' if r['yarn'] else 'no'} | {_fmt(r['bpb_short'])} | "
            f"{_fmt(r['bpb_long'])} | {_fmt(r.get('mtp1_acceptance'))} | "
            f"{_fmt(r.get('sft_bpb'))} | {_fmt(r.get('reads_operation'))} | "
            f"{_fmt(r.get('reads_constant'))} | {_fmt(r.get('call_head_nats'))} |"
        )
    if any("reads_operation" in r for r in results["rows"]):
        out += [
            "",
            "Reading probes (c2.eval.copying, teacher-forced on held-out wide-level function "
            "tasks): the share of operations and constant digits the first tool call gets right "
            "(chance 1/3 and ~1/10); call head: that call's fixed text's mean log-probability, "
            "nats per token (near 0: the format holds).",
        ]
    out += _rl_section(stages, workdir)
    out += ["", "## Plots", ""]
    if curves:
        out += [f"![training curves]({curves.name})", ""]
    out += [f"![held-out bits per byte]({bars.name})", ""]
    out += [
        "Per-stage curves (loss, MTP, optimiser, router balance, throughput) are in each "
        "stage's directory; TensorBoard: `tensorboard --logdir " + str(workdir) + "`.",
        "",
    ]
    path = workdir / REPORT_FILE
    path.write_text("\n".join(out))
    return path
