"""Many sandboxes at once, and the start-rate measurement (docs/recipe.md §3: 500+/s in
production; c2's aim is 100 starts/s on 2 cores)."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import tempfile
import time
from collections.abc import Iterable, Sequence

import numpy as np

from c2.envs.sandbox import Sandbox, SandboxLimits, SandboxResult


@dataclasses.dataclass(frozen=True)
class Job:
    """One command for the pool: what `Sandbox.run` takes."""

    command: str | Sequence[str]
    workdir: str | os.PathLike
    limits: SandboxLimits | None = None
    mount_at: str = "/workspace"
    readonly: bool = False
    binds: tuple = ()


class SandboxPool:
    """A fixed number of worker threads, each driving one sandboxed process at a time.

    Threads suffice: the work happens in child processes and the harness only waits on pipes.
    """

    def __init__(self, sandbox: Sandbox, workers: int):
        if workers < 1:
            raise ValueError(f"workers={workers}: expected >= 1")
        self.sandbox = sandbox
        self._executor = cf.ThreadPoolExecutor(workers, thread_name_prefix="sandbox")

    def submit(self, job: Job) -> cf.Future[SandboxResult]:
        return self._executor.submit(
            self.sandbox.run,
            job.command,
            job.workdir,
            limits=job.limits,
            mount_at=job.mount_at,
            readonly=job.readonly,
            binds=job.binds,
        )

    def map(self, jobs: Iterable[Job]) -> list[SandboxResult]:
        """Run every job; results in the jobs' order."""
        return [f.result() for f in [self.submit(j) for j in jobs]]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclasses.dataclass(frozen=True)
class StartRate:
    workers: int
    n: int
    starts_per_s: float
    p50_first_output_ms: float
    p99_first_output_ms: float
    isolation: str


def measure_start_rate(sandbox: Sandbox, *, n: int, workers: int) -> StartRate:
    """Start `n` sandboxes that each print one line; rate over the whole batch, latency from
    each `run` call to its first output byte."""
    with tempfile.TemporaryDirectory(prefix="c2-sbx-bench-") as d:
        sandbox.give_workspace(d)
        with SandboxPool(sandbox, workers) as pool:
            pool.map([Job(["/bin/echo", "ok"], d)] * min(n, 2 * workers))  # warm up
            t0 = time.perf_counter()
            results = pool.map([Job(["/bin/echo", "ok"], d)] * n)
            elapsed = time.perf_counter() - t0
    bad = [r for r in results if r.stdout != "ok\n" or r.first_output_s is None]
    if bad:
        raise RuntimeError(f"{len(bad)} of {n} sandboxes failed; first: {bad[0]}")
    lat_ms = np.array([r.first_output_s for r in results]) * 1e3
    return StartRate(
        workers=workers,
        n=n,
        starts_per_s=n / elapsed,
        p50_first_output_ms=float(np.percentile(lat_ms, 50)),
        p99_first_output_ms=float(np.percentile(lat_ms, 99)),
        isolation=sandbox.isolation.describe(),
    )
