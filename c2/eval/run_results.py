"""What `python -m c2.eval.run` makes of its episodes: results.json's numbers (pass@k per task
and over tasks with Wilson intervals, best-of-N, the four grading dimensions, harness errors),
predictions.jsonl and report.md with its plots."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from c2.passk import pass_at_k, wilson_interval

DIMENSIONS = ("correctness", "quality", "efficiency", "interaction")
# An episode the harness could not play or grade (its reason in failure_reason): a failure.
ERROR_STOP = "rollout_error"


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [2**i for i in range(int(math.log2(n)) + 1)] if n >= 1 else []
    return ks if not ks or ks[-1] == n else ks + [n]


def _interval(values: Sequence[float]) -> dict:
    """The mean over tasks (the independent units; one task's samples are not) and its 95%
    Wilson interval (c2.passk.wilson_interval: inside [0, 1], wide at 0 and 1)."""
    mean = float(np.mean(np.asarray(values, float)))
    return {"mean": mean, "ci95": wilson_interval(min(max(mean, 0.0), 1.0), len(values))}


def _mean(xs) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def _dimensions(eps: list[dict]) -> dict:
    def rate(num, den):
        d = sum(e["correctness"][den] or 0 for e in eps)
        return sum(e["correctness"][num] or 0 for e in eps) / d if d else None

    return {
        "correctness": {
            "pass_rate": _mean(e["passed"] for e in eps),
            "f2p_rate": rate("f2p_passed", "f2p_total"),
            "p2p_rate": rate("p2p_passed", "p2p_total"),
            "tests_error_rate": _mean(bool(e["correctness"]["tests_error"]) for e in eps),
        },
        "quality": {"new_ruff_findings_mean": _mean(e["quality"]["new_findings"] for e in eps)},
        "efficiency": {
            k + "_mean": _mean(e["efficiency"][k] for e in eps)
            for k in ("generated_tokens", "context_tokens", "turns", "tool_calls", "wall_s")
        },
        "interaction": {
            "submitted_rate": _mean(e["interaction"]["submitted"] for e in eps),
            "final_message_rate": _mean(e["interaction"]["final_message"] for e in eps),
            "invalid_tool_calls_mean": _mean(e["interaction"]["invalid_tool_calls"] for e in eps),
            "tool_errors_mean": _mean(e["interaction"]["tool_errors"] for e in eps),
            "sandbox_limit_rate": _mean(bool(e["interaction"]["sandbox_limits_hit"]) for e in eps),
        },
    }


def summarize(records: Sequence[dict], task_ids: Sequence[str], n: int) -> dict:
    """results.json's body from the episode records of samples 0..n-1 of every task."""
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r["sample"] < n:
            by_task[r["task_id"]].append(r)
    missing = [t for t in task_ids if len(by_task[t]) != n]
    if missing:
        raise ValueError(f"summarize: tasks without {n} finished episodes: {missing[:5]}")
    ks = ks_for(n)
    per_task = {}
    for t in task_ids:
        eps = sorted(by_task[t], key=lambda r: r["sample"])
        c = sum(e["passed"] for e in eps)
        per_task[t] = {
            "n": n,
            "correct": c,
            "pass@k": {str(k): pass_at_k(n, c, k) for k in ks},
            f"best_of_{n}": float(c > 0),
            **_dimensions(eps),
            "generated_tokens": int(sum(e["efficiency"]["generated_tokens"] or 0 for e in eps)),
            "flops": float(sum(e["flops"] for e in eps)),
            "wall_s": float(sum(e["efficiency"]["wall_s"] or 0.0 for e in eps)),
            "errors": sum(e.get("stop_reason") == ERROR_STOP for e in eps),
        }
    every = [e for t in task_ids for e in by_task[t]]
    overall = {
        "tasks": len(task_ids),
        "episodes": len(every),
        "pass@k": {
            str(k): _interval([per_task[t]["pass@k"][str(k)] for t in task_ids]) for k in ks
        },
        f"best_of_{n}": _interval([per_task[t][f"best_of_{n}"] for t in task_ids]),
        **_dimensions(every),
        "generated_tokens": sum(per_task[t]["generated_tokens"] for t in task_ids),
        "flops": sum(per_task[t]["flops"] for t in task_ids),
        "wall_s": sum(per_task[t]["wall_s"] for t in task_ids),
        "errors": sum(per_task[t]["errors"] for t in task_ids),
    }
    return {"samples": n, "ks": ks, "overall": overall, "per_task": per_task}


def write_predictions(path: Path, records: Sequence[dict], task_ids, model_name: str) -> None:
    by_key = {(r["task_id"], r["sample"]): r for r in records}
    with open(path, "w") as f:
        for t in task_ids:
            patch = by_key[(t, 0)]["patch"]
            line = {"instance_id": t, "model_name_or_path": model_name, "model_patch": patch}
            f.write(json.dumps(line) + "\n")


def _plots(results: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = results["ks"]
    o = results["overall"]["pass@k"]
    mean = [o[str(k)]["mean"] for k in ks]
    lo = [o[str(k)]["ci95"][0] for k in ks]
    hi = [o[str(k)]["ci95"][1] for k in ks]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(ks, mean, "o-")
    ax.fill_between(ks, lo, hi, alpha=0.25, label="95% Wilson interval over tasks")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylim(-0.02, 1.02)
    ax.set(xlabel="k", ylabel="pass@k", title=f"pass@k: {results['policy']}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out / "passk.png", dpi=110)
    plt.close(fig)
    per = results["per_task"]
    names = list(per)
    fig, ax = plt.subplots(figsize=(max(5, 0.25 * len(names)), 3.5))
    ax.bar(range(len(names)), [per[t]["pass@k"]["1"] for t in names])
    ax.set_xticks(range(len(names)), names, rotation=90, fontsize=6)
    ax.set_ylim(0, 1.02)
    ax.set(ylabel="pass@1", title="pass@1 per task")
    fig.tight_layout()
    fig.savefig(out / "per_task.png", dpi=110)
    plt.close(fig)
    return ["passk.png", "per_task.png"]


def _fmt(x, digits=3) -> str:
    return "-" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def write_report(results: dict, out: Path) -> Path:
    plots = _plots(results, out)
    o, n = results["overall"], results["samples"]
    lines = [
        f"# Benchmark: {results['policy']}",
        "",
        f"Tasks `{results['tasks_dir']}`: {o['tasks']} tasks x {n} samples = {o['episodes']} "
        f"episodes; isolation: {results.get('isolation', '-')}.",
        "",
        "| k | pass@k | 95% interval |",
        "|---|---|---|",
    ]
    for k in results["ks"]:
        p = o["pass@k"][str(k)]
        lines.append(f"| {k} | {p['mean']:.3f} | [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}] |")
    b = o[f"best_of_{n}"]
    lines += [
        "",
        f"best-of-{n}: {b['mean']:.3f} [{b['ci95'][0]:.3f}, {b['ci95'][1]:.3f}]. Intervals: "
        "Wilson, over tasks.",
    ]
    if o.get("errors"):
        lines += [
            "",
            f"{o['errors']} episodes could not be played or graded: counted as failures "
            "(reasons in episodes.jsonl, `failure_reason`).",
        ]
    lines += ["", "## Grading dimensions", ""]
    lines += ["| dimension | measure | value |", "|---|---|---|"]
    for dim in DIMENSIONS:
        for k, v in o[dim].items():
            lines.append(f"| {dim} | {k} | {_fmt(v)} |")
    lines += [
        "",
        f"Generated tokens {o['generated_tokens']}, forward FLOPs {o['flops']:.3g}, "
        f"episode wall time {o['wall_s']:.1f} s (summed).",
        "",
        "## Per task",
        "",
        "| task | correct | pass@1 | tokens |",
        "|---|---|---|---|",
    ]
    for t, r in results["per_task"].items():
        lines.append(
            f"| {t} | {r['correct']}/{n} | {r['pass@k']['1']:.3f} | {r['generated_tokens']} |"
        )
    lines += [""] + [f"![{p}]({p})" for p in plots] + [""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
