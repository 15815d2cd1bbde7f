"""Sandbox start rate and start-to-first-output latency (docs/recipe.md §3).

    python -m c2.bench.sandbox_throughput [--n 400] [--workers 1,2,4,8]

Each sandbox runs `/bin/echo ok` over an empty workspace with the full isolation of
c2.envs.sandbox (namespaces, uid drop, seccomp, a fresh cgroup, rlimits). Prints a table and one
JSON line per worker count; the aim is at least 100 starts/s on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
from collections.abc import Sequence

from c2.envs.pool import measure_start_rate
from c2.envs.sandbox import Sandbox, SandboxLimits


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m c2.bench.sandbox_throughput")
    parser.add_argument("--n", type=int, default=400, help="sandboxes per worker count")
    parser.add_argument("--workers", default="1,2,4,8", help="comma-separated pool sizes")
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",") if w.strip()]
    if args.n < 1 or not workers or min(workers) < 1:
        parser.error(f"--n {args.n} / --workers {args.workers}: expected positive numbers")
    sandbox = Sandbox(SandboxLimits(timeout_s=30))
    print(f"# {platform.node()} {os.cpu_count()} cpus, isolation: {sandbox.isolation.describe()}")
    print(f"{'workers':>8} {'starts/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    rows = []
    for w in workers:
        r = measure_start_rate(sandbox, n=args.n, workers=w)
        rows.append(r)
        p50, p99 = r.p50_first_output_ms, r.p99_first_output_ms
        print(f"{w:>8} {r.starts_per_s:>9.1f} {p50:>8.1f} {p99:>8.1f}")
    for r in rows:
        print(json.dumps(dataclasses.asdict(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
