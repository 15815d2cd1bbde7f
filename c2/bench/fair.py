"""Fair timing on a shared machine: interleaved runs, medians with spread, the load recorded.

Every benchmark that compares two systems (c2 vs transformers) times them through `interleave`:
one untimed warm-up call each, then `repeats` rounds that call every run in turn, so whatever
else the machine does hits all runs alike. Results are medians with their spread (min, max,
interquartile range). `load_check` prints the 1-minute load average before and warns loudly (or
refuses, with `require_quiet`) when the machine is busy: other processes slow PyTorch's thread
pool far more than XLA's, so comparisons from a loaded machine flatter c2. The load average
after a run includes the benchmark's own threads, so `finish` also measures what the benchmark
cannot cause: the CPU time other processes used while it ran (Linux /proc/stat minus this
process's own CPU time), in cores, and warns when that is at or above the threshold too.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable

QUIET_LOAD = 0.5  # 1-minute load average below which the machine counts as quiet


def cpu_seconds() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of this process), None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal ...: all but idle and iowait are busy.
    busy = sum(fields[:8]) - fields[3] - fields[4]
    own = resource.getrusage(resource.RUSAGE_SELF)
    return busy / os.sysconf("SC_CLK_TCK"), own.ru_utime + own.ru_stime


def processor() -> str:
    """The CPU's model name, core count and widest vector units: machines of one name differ
    between VMs (on an Intel Xeon with AMX, transformers' batch-32 greedy decoding ran ~1.5x as
    fast as on another day's machine), so a result names the processor it ran on."""
    name, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            fields = [line.split(":", 1) for line in f if ":" in line]
        info = {key.strip(): value.strip() for key, value in reversed(fields)}  # the first CPU's
        name = info.get("model name", name)
        flags = [x for x in ("avx2", "avx512f", "amx_tile") if x in info.get("flags", "").split()]
    except OSError:
        pass
    return ", ".join([name, f"{os.cpu_count()} cores", *flags])


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15-minute load averages (zeros where the platform has none)."""
    try:
        return tuple(float(x) for x in os.getloadavg())
    except OSError:
        return (0.0, 0.0, 0.0)


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of the timed calls of one run, in call order."""

    times: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def min(self) -> float:
        return min(self.times)

    @property
    def max(self) -> float:
        return max(self.times)

    @property
    def iqr(self) -> float:
        """Interquartile range (0 for fewer than 2 calls)."""
        if len(self.times) < 2:
            return 0.0
        q = statistics.quantiles(self.times, n=4, method="inclusive")
        return q[2] - q[0]

    def summary(self) -> dict:
        return {
            "median_s": self.median,
            "min_s": self.min,
            "max_s": self.max,
            "iqr_s": self.iqr,
            "n": len(self.times),
            "times_s": list(self.times),
        }

    def spread(self) -> str:
        """'median ms (min-max)' for tables."""
        return f"{self.median * 1e3:.1f} ({self.min * 1e3:.1f}-{self.max * 1e3:.1f})"


def interleave(
    runs: dict[str, Callable[[], object]],
    repeats: int,
    warmup: int = 1,
    pause: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[dict[str, Timing], dict[str, object]]:
    """Time `runs` in rounds: `warmup` untimed calls of each, then `repeats` rounds calling
    every run once, in turn, with an untimed `pause` (seconds) before each call so that the
    previous run's thread pool (OpenMP threads spin after a parallel region) has gone idle.
    Returns ({name: Timing}, {name: the last call's result})."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    results = {}
    for _ in range(warmup):
        for name, fn in runs.items():
            results[name] = fn()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            if pause:
                sleep(pause)
            t = clock()
            results[name] = fn()
            times[name].append(clock() - t)
    return {name: Timing(tuple(ts)) for name, ts in times.items()}, results


@dataclasses.dataclass
class LoadCheck:
    """Load average before and after a benchmark and the cores other processes kept busy
    during it; `busy` when the 1-minute load before, or the others' cores during, is at or above
    the threshold (the load after includes the benchmark's own threads: recorded, not judged)."""

    threshold: float = QUIET_LOAD
    before: tuple[float, float, float] | None = None
    after: tuple[float, float, float] | None = None
    others_cores: float | None = None  # mean cores used by other processes during the run
    _start: tuple[float, float, float] | None = None  # (wall, machine busy s, own cpu s)

    @property
    def busy(self) -> bool:
        return (self.before is not None and self.before[0] >= self.threshold) or (
            self.others_cores is not None and self.others_cores >= self.threshold
        )

    def record(self) -> dict:
        return {
            "processor": processor(),
            "load_average_before": self.before,
            "load_average_after": self.after,
            "other_processes_cores": self.others_cores,
            "quiet_threshold": self.threshold,
            "machine_busy": self.busy,
        }


WARNING = (
    "!!! WARNING: the machine is busy (load {load:.2f} >= {threshold}: load average before, or "
    "cores used by other processes during the run). Other "
    "processes slow PyTorch's thread pool far more than XLA, so c2-vs-transformers ratios from "
    "this run are NOT valid results; rerun on a quiet machine. !!!"
)


def load_check(
    threshold: float = QUIET_LOAD,
    require_quiet: bool = False,
    load: Callable[[], tuple[float, float, float]] = load_average,
    out=None,
    cpu: Callable[[], tuple[float, float] | None] = cpu_seconds,
) -> LoadCheck:
    """Read the load average before a benchmark: print it, warn loudly when it is at or above
    `threshold`, and exit (SystemExit 2) instead when `require_quiet`. Call `finish` after.
    `load` and `cpu` are the readings (replaceable in tests)."""
    out = out or sys.stderr
    check = LoadCheck(threshold, before=load())
    reading = cpu()
    if reading is not None:
        check._start = (time.perf_counter(), *reading)
    print(f"processor: {processor()}; load average before: {_fmt(check.before)}", file=out)
    if check.busy:
        msg = WARNING.format(load=check.before[0], threshold=threshold)
        if require_quiet:
            print(msg.replace("WARNING", "REFUSED"), file=out)
            raise SystemExit(2)
        print(msg, file=out)
    return check


def finish(
    check: LoadCheck,
    load: Callable[[], tuple[float, float, float]] = load_average,
    out=None,
    cpu: Callable[[], tuple[float, float] | None] = cpu_seconds,
) -> LoadCheck:
    """Read the load average after the benchmark; warn again if the machine was busy."""
    out = out or sys.stderr
    check.after = load()
    reading = cpu()
    if reading is not None and check._start is not None:
        wall = time.perf_counter() - check._start[0]
        others = (reading[0] - check._start[1]) - (reading[1] - check._start[2])
        check.others_cores = max(0.0, others) / max(wall, 1e-9)
    others = (
        ""
        if check.others_cores is None
        else f"; other processes used {check.others_cores:.2f} cores"
    )
    print(f"load average after: {_fmt(check.after)} (includes this benchmark){others}", file=out)
    if check.busy:
        worst = max(check.before[0], check.others_cores or 0.0)
        print(WARNING.format(load=worst, threshold=check.threshold), file=out)
    return check


def _fmt(la) -> str:
    return " / ".join(f"{x:.2f}" for x in la)
