"""Synchronous vs asynchronous RL on the tiny task family with heavy-tailed test runtimes
(docs/recipe.md §2): samples trained per second, trainer idle fraction and reward per sample,
for max_staleness S = 0 (synchronous) and S = 1, 2, 4, in one run.

    python -m c2.bench.async_rl [--init_from=DIR] [--steps 8] [--staleness 0,1,2,4]
        [--latency 1.5,1.5] [--repeats 1] [--out c2/bench/results/async_rl.json]

Each setting is the RL stage of experiments/rl_tiny.py (from its start policy unless
`--init_from` names another; `--set key=value` overrides its config in every setting) on the same
prompts in the same ledger order with the same seed, for `--steps` steps, with every task's
hidden-test run taking a Pareto (scale, alpha) number of seconds drawn from its id (capped at
20 x scale): real repositories' suites run for very different times. Rates leave out the first
step: each run compiles the update for every batch shape its buckets allow there
(`rl.precompile`; from a compilation cache the warm-up run fills), so no timed step waits on
XLA (the timed steps' `compile_s` is reported; before, a shape first met mid-run cost a 20-30 s
step, half the time of a 16-step asynchronous run), and a whole untimed run of the first setting
comes first, in which the engine compiles its programs. `--repeats R` runs R rounds of
every setting, interleaved (every other round in reverse order), round k sampling with seed + k,
and reports each setting against the first paired within rounds: the samples/s ratio and the
reward-per-sample gap, with 95% t-intervals over rounds (one run of a setting varies by about as
much as settings differ). The aim: at least 2.5x the samples/s of S = 0 at S <= 2, with no worse
reward per sample.
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

import jax
import numpy as np

from c2.eval import ablate
from c2.infer.engine import Engine
from c2.rl import config as rl_config
from c2.rl import simulate, trainer
from c2.rl.records import read_rollouts
from c2.train import lm
from c2.train.config import load_config
from c2.train.loop import load_init_params
from c2.train.metrics import read_metrics

CONFIG = Path(__file__).parents[2] / "experiments" / "rl_tiny.py"


def bench_config(
    init_from: str,
    steps: int,
    staleness: int,
    latency: tuple[float, float],
    overrides: dict | None = None,
):
    c = load_config(CONFIG)
    c.init_from = init_from
    rl_config.adopt_init_positions(c)  # the start policy's own positional scaling (YaRN)
    c.train.steps = steps
    c.train.checkpoint_every = steps
    c.train.progress_bar = False
    # rl_tiny's update (lr, one forward a step, packed groups) on a smaller step: the basic level,
    # 4 prompts x 8 samples. No warmup: a run is a few steps.
    c.rl.tasks = c.rl.heldout_tasks = "functions:basic"
    c.rl.task_seed, c.rl.prompts_per_step = 0, 4
    c.optimizer.warmup_steps = 0
    c.rl.max_staleness = staleness
    c.rl.rollout.test_latency_pareto = latency
    c.rl.rollout.tool_workers = 32  # graders wait on the simulated suites, not on the CPU
    c.rl.eval.tasks, c.rl.eval.samples = 2, 1  # the held-out evaluation is not measured here
    c.rl.precompile = True  # every batch shape at the first step, which the rates leave out
    for path, value in (overrides or {}).items():  # --set, for every setting alike
        ablate.set_field(c, path, value)
    return c


def summarize(workdir: Path, skip: int = 1) -> dict:
    """Rates over the steps after the first `skip` (compilation)."""
    rows = read_metrics(workdir / "metrics.jsonl")[skip:]
    wall = sum(r["step_time_s"] for r in rows)
    samples = sum(r["valid_samples"] for r in rows)
    idle = sum(r["trainer_idle_frac"] * r["step_time_s"] for r in rows)
    rewards = [r["reward/total"] for r in rows]
    return {
        "steps": len(rows),
        "samples": samples,
        "wall_s": wall,
        "samples_per_s": samples / wall,
        "trainer_idle_frac": idle / wall,
        "reward_per_sample": float(np.mean(rewards)),
        "reward_se": float(np.std(rewards) / max(np.sqrt(len(rewards)), 1)),
        "pass_rate": float(np.mean([r["pass_rate"] for r in rows])),
        "staleness_mean": float(np.mean([r.get("staleness_mean", 0.0) for r in rows])),
        "groups_zero_advantage": float(np.mean([r["groups_zero_advantage"] for r in rows])),
        "compile_s": sum(r.get("compile_s", 0.0) for r in rows),  # in the timed steps
    }


def decode_costs(init_from: str, slots: int, overrides: dict) -> tuple[float, float]:
    """(floor, per-sequence) seconds of one decode step, fitted at 1 and `slots` sequences."""
    config = bench_config(init_from, 3, 0, (0.0, 0.0), overrides)
    _, cfg, _, _ = rl_config.validate_rl(config, jax.device_count())
    task = lm.build_task(rl_config.lm_part(config))
    params = load_init_params(init_from, task)
    new, times = 64, {}
    for n in (1, slots, 1, slots):  # interleaved, the second of each kept (compiled)
        engine = Engine(params, cfg, max_slots=slots, max_len=256, temperature=1.0)
        engine.generate([[1] * 16], 2)  # compile the feed and decode calls
        t0 = time.perf_counter()
        engine.generate([[1 + i] * 16 for i in range(n)], new)
        times[n] = (time.perf_counter() - t0) / new
    per_seq = max(times[slots] - times[1], 0.0) / (slots - 1)
    return max(times[1] - per_seq, 1e-6), per_seq


def sim_inputs(results: dict, workdirs: dict, args, slots: int, decode) -> dict:
    """What c2.rl.simulate needs to replay this run: costs measured here."""
    sync = min(results)
    lengths = [
        r["loss_mask"].count(1)
        for path in sorted((workdirs[sync] / "rollouts").glob("step_*.jsonl"))
        for r in read_rollouts(path, with_routing=False)
    ]
    logs = np.log([n for n in lengths if n > 0])
    train = {S: _mean_train_s(workdirs[S]) for S in results}
    busiest = max(results)
    return {
        "engine_slots": slots,
        "decode_floor_s": decode[0],
        "decode_per_seq_s": decode[1],
        "tokens_median": float(np.exp(np.median(logs))),
        "tokens_sigma": float(np.std(logs)),
        "tokens_max": int(max(lengths)),
        "train_fixed_s": train[sync],
        "train_per_token_s": 0.0,  # fixed shapes: a step costs the same whatever it holds
        "prompts_per_step": 4,
        "group_size": 8,
        "steps": args.steps,
        "contention": max(train[busiest] / train[sync] - 1.0, 0.0),
    }


def common_prompt_rewards(workdirs: dict) -> dict:
    """Reward per sample over the prompts every setting trained: each setting trains its
    finished groups first, so in a short run the sets differ and so would their difficulty."""
    by_setting = {}
    for S, workdir in workdirs.items():
        rewards: dict[str, list[float]] = {}
        for path in sorted((workdir / "rollouts").glob("step_*.jsonl")):
            for r in read_rollouts(path, with_routing=False):
                rewards.setdefault(r["prompt_id"], []).append(r["reward"])
        by_setting[S] = rewards
    common = set.intersection(*(set(r) for r in by_setting.values()))
    return {
        S: float(np.mean([x for p in sorted(common) for x in r[p]])) if common else float("nan")
        for S, r in by_setting.items()
    }


def run_round(k: int, settings, tmp: Path, args, latency, overrides, rounds: list) -> tuple:
    """Round k: every setting once (in reverse order in odd rounds, so none always goes first),
    sampling with seed + k. ({S: summary}, {S: workdir}); each result is written to --out as it
    comes, after the earlier rounds', so a later failure loses nothing measured."""
    results, workdirs = {}, {}
    for S in settings if k % 2 == 0 else settings[::-1]:
        t0 = time.perf_counter()
        workdir = workdirs[S] = tmp / (f"r{k}" if args.repeats > 1 else "") / f"S{S}"
        config = bench_config(args.init_from, args.steps, S, latency, overrides)
        config.train.seed += k  # the round's own samples; its settings share them
        trainer.run(config, workdir)
        r = results[S] = summarize(workdir) | {"total_s": time.perf_counter() - t0}
        print(
            f"round {k + 1}/{args.repeats} S={S}: {r['samples_per_s']:.2f} samples/s, "
            f"trainer idle {r['trainer_idle_frac']:.2f}, reward/sample "
            f"{r['reward_per_sample']:.3f} +- {r['reward_se']:.3f}, staleness "
            f"{r['staleness_mean']:.2f}, compiling {r['compile_s']:.1f} s",
            flush=True,
        )
        if args.out:
            done = [*rounds, results]
            Path(args.out).write_text(json.dumps([_keyed(x) for x in done]))
    return results, workdirs


def paired_over_rounds(rounds: Sequence[dict[int, dict]], base: int) -> dict[int, dict]:
    """Each setting against `base` in the same round (the same machine state, the same prompts):
    the samples/s ratio and the reward-per-sample gap on the prompts both trained, per round,
    with their mean and 95% t-interval over rounds. One run of a setting varies by as much as
    settings differ (BENCHMARKS.md, "Asynchronous RL"), so the gap needs several rounds."""
    out = {}
    for S in [setting for setting in rounds[0] if setting != base]:
        speedup = [r[S]["samples_per_s"] / r[base]["samples_per_s"] for r in rounds]
        gap = [r[S]["reward_common_prompts"] - r[base]["reward_common_prompts"] for r in rounds]
        out[S] = {
            "speedup": ablate.t_interval(speedup) | {"rounds": speedup},
            "reward_gap": ablate.t_interval(gap) | {"rounds": gap},
        }
    return out


def _mean_over(rounds: Sequence[dict[int, dict]], S: int) -> dict:
    return {k: float(np.mean([r[S][k] for r in rounds])) for k in rounds[0][S]}


def _keyed(d: dict) -> dict:
    return {str(k): v for k, v in d.items()}


def _ci(interval: dict, fmt: str = "+.3f") -> str:
    lo_hi = interval["ci95"]
    return f"[{lo_hi[0]:{fmt}}, {lo_hi[1]:{fmt}}]" if lo_hi else "[one round]"


def _mean_train_s(workdir: Path) -> float:
    return float(np.mean([r["train_s"] for r in read_metrics(workdir / "metrics.jsonl")[1:]]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2.bench.async_rl")
    parser.add_argument(
        "--init_from", default=None, help="the RL start (default: rl_tiny's, the shipped policy)"
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--staleness", default="0,1,2,4")
    parser.add_argument("--latency", default="1.5,1.5", help="Pareto scale_s,alpha of test runs")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds of every setting, interleaved; >1 adds paired means with 95%% intervals",
    )
    parser.add_argument("--out", default=None, help="JSON results (default: print only)")
    parser.add_argument("--workdir", default=None, help="keep the runs here (default: a tmp dir)")
    parser.add_argument(
        "--set", action="append", default=[], help="config override key=value, every setting"
    )
    args = parser.parse_args(argv)
    args.init_from = args.init_from or load_config(CONFIG).init_from
    settings = [int(s) for s in args.staleness.split(",")]
    latency = tuple(float(x) for x in args.latency.split(","))
    if args.steps < 3 or min(settings) < 0 or len(latency) != 2 or args.repeats < 1:
        parser.error(
            "--steps >= 3, --staleness of ints >= 0, --latency scale,alpha, --repeats >= 1"
        )
    try:
        overrides = ablate.parse_set(args.set)
        slots = bench_config(args.init_from, 3, 0, latency, overrides).rl.rollout.engine_slots
    except (ValueError, KeyError) as e:
        parser.error(str(e))
    load = os.getloadavg()
    print(f"# {platform.node()} {os.cpu_count()} cpus, load average {load[0]:.2f} (before)")
    rounds: list[dict[int, dict]] = []
    with tempfile.TemporaryDirectory(prefix="async_rl_") as tmp:
        tmp = Path(args.workdir or tmp)
        # Every run compiles its programs anew (new jitted functions): from this cache after the
        # first time, and each run compiles all its batch shapes at its first step
        # (rl.precompile), which the rates leave out, so no timed step waits on XLA.
        if not jax.config.jax_compilation_cache_dir:
            jax.config.update("jax_compilation_cache_dir", str(tmp / "jax_cache"))
        decode = decode_costs(args.init_from, slots, overrides)
        print(f"decode step: {decode[0] * 1e3:.1f} ms + {decode[1] * 1e3:.2f} ms per sequence")
        # Off the clock, a whole run of the first setting: the engine compiles a program per
        # (rows, chunk, attended length) it meets, once per process (a 2-step warm-up left the
        # first timed run compiling for 18 s in its first 3 timed steps).
        warm = bench_config(args.init_from, args.steps, settings[0], latency, overrides)
        trainer.run(warm, tmp / "warmup")
        for k in range(args.repeats):
            results, workdirs = run_round(k, settings, tmp, args, latency, overrides, rounds)
            common = common_prompt_rewards(workdirs)
            rounds.append({S: results[S] | {"reward_common_prompts": common[S]} for S in settings})
            if k == 0:
                inputs = sim_inputs(rounds[0], workdirs, args, slots, decode)
    means = {S: _mean_over(rounds, S) for S in settings}
    paired = paired_over_rounds(rounds, settings[0])
    head = f"{'S':>3} {'samples/s':>10} {'vs S=' + str(settings[0]):>9} {'idle':>6} {'reward':>8}"
    print(f"\n{head} {'same prompts':>13}   (means over {args.repeats} round(s))")
    for S, r in means.items():
        speedup = r["samples_per_s"] / means[settings[0]]["samples_per_s"]
        print(
            f"{S:>3} {r['samples_per_s']:>10.2f} {speedup:>8.2f}x {r['trainer_idle_frac']:>6.2f} "
            f"{r['reward_per_sample']:>8.3f} {r['reward_common_prompts']:>13.3f}"
        )
    if args.repeats > 1:
        print(f"\npaired over rounds against S={settings[0]} (mean [95% t-interval]):")
        for S, p in paired.items():
            sp, gap = p["speedup"], p["reward_gap"]
            print(
                f"S={S}: samples/s x{sp['mean']:.2f} {_ci(sp, '.2f')}, reward/sample on the same "
                f"prompts {gap['mean']:+.3f} {_ci(gap)}"
            )
    after = os.getloadavg()
    print(f"# load average {after[0]:.2f} (after)")
    if args.out:
        out = {
            "machine": f"{platform.node()} {os.cpu_count()} cpus",
            "load_before": load[0],
            "load_after": after[0],
            "command": " ".join(["python -m c2.bench.async_rl", *(argv or sys.argv[1:])]),
            "latency_pareto": latency,
            "overrides": overrides,
            "repeats": args.repeats,
            "results": _keyed(means),
            "rounds": [_keyed(r) for r in rounds],
            "paired": _keyed(paired),
            "sim_inputs": inputs,
        }
        Path(args.out).write_text(json.dumps(out, indent=2))
        print(
            "\n# the simulator on this run's measured costs (python -m c2.rl.simulate --validate)"
        )
        simulate.main(["--validate", args.out, "--staleness", args.staleness])
    return 0


if __name__ == "__main__":
    sys.exit(main())
