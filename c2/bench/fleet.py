"""The Ray rollout fleet's overhead: RL samples trained per second with the local backend (one
engine in the trainer's process) and with 1, 2 and 4 Ray rollout workers, on this machine, in
one run, settings interleaved; beside each, the simulator's prediction for the same setting
(c2/rl/simulate.py, its costs measured here as in c2/bench/async_rl.py).

    python -m c2.bench.fleet --init_from=RL_START [--steps 6] [--workers 1,2,4] [--repeats 2]
        [--staleness 2] [--out c2/bench/results/fleet.json]

Each setting is the RL stage of experiments/rl_tiny.py (the same prompts in the same ledger
order, the same seed) for `--steps` steps with simulated heavy-tailed test runtimes; rates
leave out the first step (compilation, and the workers' start). A warm-up run compiles the
trainer's programs first; Ray workers share the persistent compilation cache. Repeats run the
settings again in reverse order (local, 1, 2, 4, then 4, 2, 1, local) so drift in the machine's
load falls on every setting alike.

On one machine every worker shares its cores with the trainer and the others: the measured
rate shows the fleet's overhead (actor calls, pickled samples, weights through the store, one
engine per worker), not its scaling; the simulator's `instances = workers` assumes each worker
has hardware of its own, which is what a cluster gives.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from c2.bench import async_rl
from c2.rl import simulate
from c2.train.metrics import read_metrics


def setting_config(init_from: str, steps: int, staleness: int, latency, workers: int):
    """workers 0: the local backend; n >= 1: n Ray workers."""
    c = async_rl.bench_config(init_from, steps, staleness, latency)
    c.rl.weight_store_dtype = "float32"  # both backends serve the same bits
    if workers:
        c.rl.rollout_backend, c.rl.num_rollout_workers = "ray", workers
        c.rl.ray_worker_cpus = 0.0  # one machine: the workers share its cores with the trainer
    return c


def name(workers: int) -> str:
    return "local" if workers == 0 else f"ray{workers}"


def predict(inputs: dict, latency, staleness: int, workers: int, seeds: int = 3) -> dict:
    """The simulator's samples/s for `workers` instances (the local backend is one)."""
    measured = {"sim_inputs": inputs, "latency_pareto": list(latency)}
    base = simulate.validation_config(measured, staleness)
    runs = [
        simulate.simulate(dataclasses.replace(base, instances=max(workers, 1), seed=k))
        for k in range(seeds)
    ]
    return {k: float(np.mean([r[k] for r in runs])) for k in ("samples_per_s", "staleness_mean")}


def rollout_rate(workdir: Path, skip: int = 1) -> float:
    """Episodes finished per second by the rollouts (all backends count them alike), after
    the first `skip` steps."""
    rows = read_metrics(workdir / "metrics.jsonl")[skip:]
    wall = sum(r["step_time_s"] for r in rows)
    return sum(r["rollout_samples_per_s"] * r["step_time_s"] for r in rows) / wall


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2.bench.fleet")
    parser.add_argument("--init_from", required=True, help="agent-SFT workdir (the RL start)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workers", default="1,2,4", help="Ray worker counts")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--staleness", type=int, default=2)
    parser.add_argument("--latency", default="1.5,1.5", help="Pareto scale_s,alpha of test runs")
    parser.add_argument("--out", default=None)
    parser.add_argument("--workdir", default=None, help="keep the runs here (default: a tmp dir)")
    args = parser.parse_args(argv)
    counts = [0] + [int(x) for x in args.workers.split(",")]
    latency = tuple(float(x) for x in args.latency.split(","))
    if args.steps < 3 or min(counts[1:]) < 1 or args.repeats < 1:
        parser.error("--steps >= 3, --workers of ints >= 1, --repeats >= 1")
    from c2.rl import trainer  # jax and the model: after argument errors

    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    load = os.getloadavg()
    print(f"# {platform.node()} {os.cpu_count()} cpus, load average {load[0]:.2f} (before)")
    order = [c for k in range(args.repeats) for c in (counts if k % 2 == 0 else counts[::-1])]
    runs: dict[str, list[dict]] = {name(c): [] for c in counts}
    with tempfile.TemporaryDirectory(prefix="fleet_") as tmp:
        root = Path(args.workdir or tmp)
        cache = root / "jax_cache"
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(cache))
        import jax

        jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
        warm = setting_config(args.init_from, 2, args.staleness, (0.0, 0.0), 0)
        trainer.run(warm, root / "warmup")  # compile the trainer's programs off the clock
        workdirs = {}
        for i, c in enumerate(order):
            workdir = workdirs[name(c)] = root / f"{i:02d}-{name(c)}"
            t0 = time.perf_counter()
            cfg = setting_config(args.init_from, args.steps, args.staleness, latency, c)
            trainer.run(cfg, workdir)
            r = async_rl.summarize(workdir) | {
                "rollout_samples_per_s": rollout_rate(workdir),
                "total_s": time.perf_counter() - t0,
            }
            runs[name(c)].append(r)
            print(
                f"{name(c)}: {r['samples_per_s']:.2f} samples/s trained, "
                f"{r['rollout_samples_per_s']:.2f} generated, trainer idle "
                f"{r['trainer_idle_frac']:.2f}, staleness {r['staleness_mean']:.2f}, "
                f"total {r['total_s']:.0f} s",
                flush=True,
            )
            if args.out:  # kept as it comes: a later failure loses nothing measured
                Path(args.out).write_text(json.dumps({"runs": runs}, indent=2))
        slots = warm.rl.rollout.engine_slots
        decode = async_rl.decode_costs(args.init_from, slots)
        local = {args.staleness: runs["local"][-1]}
        sim_args = argparse.Namespace(steps=args.steps)
        inputs = async_rl.sim_inputs(
            local, {args.staleness: workdirs["local"]}, sim_args, slots, decode
        )
    after = os.getloadavg()
    table = {}
    base = float(np.mean([r["samples_per_s"] for r in runs["local"]]))
    print(f"\n{'backend':>8} {'samples/s':>10} {'vs local':>9} {'generated/s':>12} {'sim/s':>7}")
    for c in counts:
        rates = [r["samples_per_s"] for r in runs[name(c)]]
        generated = [r["rollout_samples_per_s"] for r in runs[name(c)]]
        sim = predict(inputs, latency, args.staleness, c)
        table[name(c)] = {
            "samples_per_s": float(np.mean(rates)),
            "samples_per_s_runs": rates,
            "generated_per_s": float(np.mean(generated)),
            "generated_per_s_runs": generated,
            "vs_local": float(np.mean(rates)) / base,
            "simulated_samples_per_s": sim["samples_per_s"],
            "simulated_staleness_mean": sim["staleness_mean"],
        }
        t = table[name(c)]
        print(
            f"{name(c):>8} {t['samples_per_s']:>10.2f} {t['vs_local']:>8.2f}x "
            f"{t['generated_per_s']:>12.2f} {t['simulated_samples_per_s']:>7.2f}"
        )
    print(f"# load average {after[0]:.2f} (after)")
    if args.out:
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.node()}, {os.cpu_count()} cpus",
            "load_before": load[0],
            "load_after": after[0],
            "args": vars(args),
            "sim_inputs": inputs,
            "table": table,
            "runs": runs,
        }
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
