"""Self-summarisation vs prompt-based compaction vs no context management, after RL, in one run.

    python -m c2.bench.context_management --init_from=runs/notes_chain/3_notes [--seeds 0,1,2]
        [--modes self_summary,compaction,none] [--steps 12] [--out FILE.json] [--workdir DIR]

Each (mode, seed) is the RL stage of experiments/rl_notes_tiny.py (notes tasks whose episodes
outgrow its 800-token context; the start policy from experiments/notes_chain_tiny.sh) with
`config.rl.context_management = mode` and `config.train.seed = seed`, from the same start; runs
go seed by seed, the modes interleaved.
The held-out set (24 tasks x 2 samples) is the same for every run. Reported per mode, pooled
over seeds: held-out pass@1 before and after RL with a 95% interval over tasks (tasks are the
independent units: a task's pass rate is averaged over seeds and samples), generated tokens per
solved task (every segment counted), segments per episode, and the paired difference of
self-summary minus each other mode over tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from c2.rl import config as rl_config
from c2.rl import evaluation, trainer
from c2.train.config import load_config

CONFIG = Path(__file__).parents[2] / "experiments" / "rl_notes_tiny.py"
MODES = ("self_summary", "compaction", "none")


def bench_config(init_from: str, mode: str, seed: int, steps: int):
    c = load_config(CONFIG)
    c.init_from = init_from
    rl_config.adopt_init_positions(c)  # the start policy's own positional scaling (YaRN)
    c.train.seed = seed
    c.train.steps = steps
    c.train.checkpoint_every = steps
    c.train.progress_bar = False
    c.rl.context_management = mode
    return c


def read_evals(workdir: Path) -> dict[int, dict]:
    lines = (workdir / "eval.jsonl").read_text().splitlines()
    return {e["step"]: e for e in map(json.loads, filter(str.strip, lines))}


def pooled(evals: Sequence[dict]) -> dict:
    """One mode's evaluations at one step, pooled over seeds: pass@1 with its interval over
    tasks, tokens per solved task, segments per episode."""
    tasks = sorted(evals[0]["per_task_passes"])
    k = sum(e["k"] for e in evals)
    rate = np.array([sum(e["per_task_passes"][t] for e in evals) / k for t in tasks])
    half = evaluation.Z95 * rate.std(ddof=1) / np.sqrt(len(rate)) if len(rate) > 1 else 0.0
    passes = sum(sum(e["per_task_passes"].values()) for e in evals)
    tokens = sum(e["generated_tokens_mean"] * e["samples"] for e in evals)
    return {
        "pass@1": float(rate.mean()),
        "pass@1_ci95": [float(rate.mean() - half), float(rate.mean() + half)],
        "passes": int(passes),
        "episodes": int(sum(e["samples"] for e in evals)),
        "tokens_per_solved_task": float(tokens / passes) if passes else None,
        "segments_mean": float(np.mean([e.get("segments_mean", 1.0) for e in evals])),
        "per_task_passes": {t: sum(e["per_task_passes"][t] for e in evals) for t in tasks},
        "k": k,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m c2.bench.context_management")
    p.add_argument(
        "--init_from", required=True, help="the RL start (experiments/notes_chain_tiny.sh)"
    )
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", default=None, help="JSON results (written as runs finish)")
    p.add_argument("--workdir", default=None, help="keep the runs here (default: a tmp dir)")
    args = p.parse_args(argv)
    modes = args.modes.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    if bad := [m for m in modes if m not in MODES]:
        p.error(f"--modes: {bad} not among {MODES}")
    load = os.getloadavg()
    print(f"# {platform.node()} {os.cpu_count()} cpus, load average {load[0]:.2f} (before)")
    runs: dict[str, dict[int, dict[int, dict]]] = {m: {} for m in modes}
    with tempfile.TemporaryDirectory(prefix="context_management_") as tmp:
        root = Path(args.workdir or tmp)
        for seed in seeds:
            for mode in modes:
                workdir = root / f"{mode}-s{seed}"
                t0 = time.perf_counter()
                trainer.run(bench_config(args.init_from, mode, seed, args.steps), workdir)
                runs[mode][seed] = read_evals(workdir)
                end = runs[mode][seed][args.steps]
                print(
                    f"{mode} seed {seed}: held-out pass@1 {runs[mode][seed][0]['pass@1']:.3f} -> "
                    f"{end['pass@1']:.3f}, segments {end.get('segments_mean', 1):.2f} "
                    f"({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
                if args.out:  # kept as it comes: a later failure loses nothing measured
                    Path(args.out).write_text(json.dumps(_results(runs, args.steps), indent=1))
    results = _results(runs, args.steps)
    print(f"\n{'mode':>13} {'pass@1 start':>13} {'pass@1 after RL':>22} {'tokens/solved':>14}")
    for mode, r in results["modes"].items():
        a, b = r["start"], r["after"]
        ci = f"[{b['pass@1_ci95'][0]:.3f}, {b['pass@1_ci95'][1]:.3f}]"
        tps = f"{b['tokens_per_solved_task']:.0f}" if b["tokens_per_solved_task"] else "-"
        print(f"{mode:>13} {a['pass@1']:>13.3f} {b['pass@1']:>8.3f} {ci:>13} {tps:>14}")
    for name, d in results["paired"].items():
        lo, hi = d["pass@1_delta_ci95"]
        print(f"{name}: pass@1 {d['pass@1_delta']:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    print(f"# load average {os.getloadavg()[0]:.2f} (after)")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


def _results(runs: dict, steps: int) -> dict:
    modes = {}
    for mode, by_seed in runs.items():
        done = [e for e in by_seed.values() if steps in e]
        if done:
            modes[mode] = {
                "seeds": len(done),
                "start": pooled([e[0] for e in done]),
                "after": pooled([e[steps] for e in done]),
            }
    paired = {}
    if "self_summary" in modes:
        for other in modes:
            if other != "self_summary":
                paired[f"self_summary - {other}"] = evaluation.compare(
                    modes[other]["after"], modes["self_summary"]["after"]
                )
    return {"steps": steps, "modes": modes, "paired": paired}


if __name__ == "__main__":
    sys.exit(main())
