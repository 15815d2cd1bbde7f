"""Held-out evaluation during RL: pass@1 and best-of-K over K samples per task, with intervals.

Per task i with c_i of K samples correct: pass@1_i = c_i / K and best-of-K_i = pass@K = 1[c_i > 0]
(the unbiased estimator with n = K). The 95% interval of a rate over tasks (tasks are the
independent units; samples of one task are not) is the Wilson interval (c2.passk), which stays
inside [0, 1] and keeps a width at 0 and 1. `compare` gives the paired difference of two
evaluations of the same tasks (RL start vs now), with the normal interval
mean +- 1.96 * sd / sqrt(n_tasks) of a difference in [-1, 1]. The RL run's evaluations:
`run_heldout` (DIR/rollouts/eval_NNNNNN.jsonl, DIR/eval.jsonl), `read_done` on resume,
`final_summary`.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from c2.passk import Z95, pass_at_k, wilson_interval
from c2.rl.episodes import EpisodeRequest
from c2.rl.records import Sample, write_rollouts

log = logging.getLogger(__name__)


def _rate_interval(values: np.ndarray) -> tuple[float, float, float]:
    """The mean of per-task rates in [0, 1] and its 95% Wilson interval over the tasks."""
    mean = min(1.0, max(0.0, float(values.mean())))  # rounding of a mean of rates
    lo, hi = wilson_interval(mean, len(values))
    return mean, lo, hi


def _interval(values: np.ndarray) -> tuple[float, float, float]:
    """The mean of paired differences and its normal 95% interval."""
    mean = float(values.mean())
    half = Z95 * float(values.std(ddof=1)) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return mean, mean - half, mean + half


def per_task(samples: Sequence[Sample]) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = defaultdict(list)
    for s in samples:
        out[s.task_id].append(bool(s.passed))
    return dict(out)


def summarize(samples: Sequence[Sample]) -> dict:
    """pass@1 and best-of-K (K = samples per task) over tasks, with 95% intervals."""
    tasks = per_task(samples)
    if not tasks:
        raise ValueError("summarize: no samples")
    ks = {len(v) for v in tasks.values()}
    if len(ks) != 1:
        raise ValueError(f"summarize: tasks have different sample counts {sorted(ks)}")
    K = ks.pop()
    p1 = np.array([sum(v) / K for v in tasks.values()])
    best = np.array([pass_at_k(K, sum(v), K) for v in tasks.values()])
    m1, lo1, hi1 = _rate_interval(p1)
    mk, lok, hik = _rate_interval(best)
    tokens = np.array([sum(seg.generated_tokens for seg in s.chain) for s in samples])
    terms = defaultdict(list)
    for s in samples:
        for name, v in s.reward_terms.items():
            terms[name].append(v)
    return {
        "tasks": len(tasks),
        "samples": len(samples),
        "k": K,
        "pass@1": m1,
        "pass@1_ci95": [lo1, hi1],
        f"best_of_{K}": mk,
        f"best_of_{K}_ci95": [lok, hik],
        "generated_tokens_mean": float(np.mean(tokens)),
        # What a solved task costs: generated tokens (every segment of a chain) per pass.
        "tokens_per_solved_task": float(np.sum(tokens) / max(sum(s.passed for s in samples), 1))
        if any(s.passed for s in samples)
        else None,
        "segments_mean": float(np.mean([len(s.chain) for s in samples])),
        **{f"term_{k}_mean": float(np.mean(v)) for k, v in sorted(terms.items())},
        "per_task_passes": {t: int(sum(v)) for t, v in sorted(tasks.items())},
    }


def compare(before: dict, after: dict) -> dict:
    """Paired difference after - before of pass@1 and best-of-K over the tasks both evaluated."""
    common = sorted(set(before["per_task_passes"]) & set(after["per_task_passes"]))
    if len(common) < 2:
        raise ValueError("compare: fewer than 2 tasks evaluated in both")
    K0, K1 = before["k"], after["k"]
    b, a = before["per_task_passes"], after["per_task_passes"]
    d1 = np.array([a[t] / K1 - b[t] / K0 for t in common])
    dk = np.array([float(a[t] > 0) - float(b[t] > 0) for t in common])
    m1, lo1, hi1 = _interval(d1)
    mk, lok, hik = _interval(dk)
    return {
        "tasks": len(common),
        "pass@1_delta": m1,
        "pass@1_delta_ci95": [lo1, hi1],
        "best_of_k_delta": mk,
        "best_of_k_delta_ci95": [lok, hik],
    }


# The RL run's evaluations -------------------------------------------------------------------


def run_heldout(runner, heldout, k: int, workdir: Path, step: int) -> dict:
    """`k` episodes of every held-out task on `runner` (an engine holding the weights of `step`):
    their rollouts in DIR/rollouts/eval_NNNNNN.jsonl, the summary appended to DIR/eval.jsonl."""
    requests = [
        EpisodeRequest(t, t.task_id, f"eval{step:06d}-{t.task_id}", j)
        for t in heldout
        for j in range(k)
    ]
    samples = runner.run(requests)
    write_rollouts(workdir / "rollouts", f"eval_{step:06d}", samples)
    summary = summarize(samples) | {"step": step}
    with open(workdir / "eval.jsonl", "a") as f:
        f.write(json.dumps(summary) + "\n")
    log.info(
        "held-out at step %d: pass@1 %.3f best-of-%d %.3f",
        step,
        summary["pass@1"],
        k,
        summary[f"best_of_{k}"],
    )
    return summary


def step_metrics(summary: dict) -> dict:
    """What a step's metrics row carries of its evaluation."""
    k = summary["k"]
    return {"eval_pass@1": summary["pass@1"], "eval_best_of_k": summary[f"best_of_{k}"]}


def read_done(workdir: Path, upto: int) -> dict[int, dict]:
    """Evaluations already done (a resumed run keeps those at or before its step)."""
    path = workdir / "eval.jsonl"
    if not path.is_file():
        return {}
    evals = {}
    for line in path.read_text().splitlines():
        if line.strip():
            e = json.loads(line)
            if e["step"] <= upto:
                evals[e["step"]] = e
    path.write_text("".join(json.dumps(e) + "\n" for _, e in sorted(evals.items())))
    return evals


def final_summary(evals: dict[int, dict], steps: int) -> dict:
    """The run's summary: each evaluation (without per-task passes), and the paired gain from
    the start to the last step when both were evaluated."""
    out = {"steps": steps, "evaluations": {str(s): _brief(e) for s, e in sorted(evals.items())}}
    if 0 in evals and steps in evals and steps:
        out["gain"] = compare(evals[0], evals[steps])
    return out


def _brief(e: dict) -> dict:
    return {k: v for k, v in e.items() if k != "per_task_passes"}
